"""Where Bernard reaches past a library's documented interface, and only here.

One module per library, each importing only the library it departs from (and the standard
library); api/, worker/ and shared/ import them, never the other way round. Each departure
has a test in tests/compat/ that fails when the library renames the name or changes what it
does, and the library an upper bound in pyproject.toml. docs/architecture.md lists them
with the reason each is kept.

Nothing is imported here: importing `compat.langchain_openai` loads LangChain, which the
API process never does.
"""
