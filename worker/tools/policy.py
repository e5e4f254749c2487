"""Which tool calls run at once, which wait for the user's decision, and which a user may not
make at all: the one place that decides. The router asks it before each call, the resume
harness again before an approved call runs (a decision from any route), and the `undo` tool
is ruled on as the calls it would make.

An operator writes the rules in a TOML file (`BERNARD_POLICY_FILE`, read once as the worker
starts; unset, the household default beside this module, policy.toml, which it replaces).
Each `[[rules]]` entry matches on what it names, every name it sets matching (globs,
`fnmatch`, case-insensitive; a list is any of its globs): `tool`, `server` (an MCP server),
and for a Home Assistant call its `domain`, `service`, `entity` and `area` (an entity's
area, name or id, read from Home Assistant only when some rule names one), and `within`,
bounds on numeric options (`{temperature = [16, 26]}`: each option named that the call
gives is a number within them). It says `allow` or `ask`. First match wins; after the
rules, a call asks when its tool declares it changes the world (`requires_confirmation` in
its metadata), else runs.

Before the rules, `[users.<user>]` `deny` lists rules a key's user may not go past: such a
call is refused, never asked (the model reads that it is not allowed for this user). The
names in `BERNARD_AUTO_APPROVE_TOOLS` and `BERNARD_CONFIRM_TOOLS` come next, as rules
allowing or asking for those tools. Which rule decided is said (`Ruling.shown`) in the
`tool_call` event and the call log.

A tool may say what a call acts on (`policy_subjects` in its metadata: `Subjects`); each
subject is ruled on, and the strictest ruling stands (refused over asked over allowed).
"""

from __future__ import annotations

import asyncio
import fnmatch
import tomllib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from shared.settings import Settings
from worker.tools.numbers import as_number
from worker.tools.runtime import ToolRuntime, runtime_config

__all__ = [
    "DECLARED",
    "Policy",
    "PolicyError",
    "PolicyVerdict",
    "Ruling",
    "Subject",
    "Subjects",
    "load_policy",
    "parse_policy",
    "policy_of",
    "requires_confirmation",
    "rule_on",
]

DECLARED = "declared"  # the rule name of a call no rule matched


class PolicyVerdict(StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


_STRICTNESS = {PolicyVerdict.ALLOW: 0, PolicyVerdict.ASK: 1, PolicyVerdict.DENY: 2}


def _globs(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


Globs = Annotated[tuple[str, ...], BeforeValidator(_globs)]


class Match(BaseModel):
    """What a rule matches: every field it sets must match the call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(None, max_length=200)
    tool: Globs | None = None
    server: Globs | None = None
    domain: Globs | None = None
    service: Globs | None = None
    entity: Globs | None = None
    area: Globs | None = None
    within: dict[str, tuple[float, float]] | None = None

    @property
    def needs_area(self) -> bool:
        return self.area is not None


class PolicyRule(Match):
    decision: Literal["allow", "ask"]


class UserRules(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    deny: tuple[Match, ...] = ()


class PolicyFile(BaseModel):
    """The file's shape (the edge: what an operator wrote)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: tuple[PolicyRule, ...] = ()
    users: dict[str, UserRules] = Field(default_factory=dict)


class PolicyError(ValueError):
    """The policy file cannot be read, or is not a policy (the worker does not start)."""


@dataclass(frozen=True, slots=True)
class Subject:
    """What one call acts on, as the rules read it. `area` is None for an entity in no area;
    `area_known` is False when it could not be read (then a rule naming an area matches
    unless it allows: the house is not opened on a guess)."""

    tool: str
    declared: bool = False
    server: str | None = None
    domain: str | None = None
    service: str | None = None
    entity: str | None = None
    area: tuple[str, ...] | None = None  # the area's name and id
    area_known: bool = True
    options: Mapping[str, Any] = field(default_factory=dict)


# A tool's `policy_subjects`: (args, config, areas) -> what the call acts on; `areas` says
# whether any rule names an area (else none need be read).
Subjects = Callable[[dict[str, Any], RunnableConfig, bool], Awaitable[list[Subject]]]


@dataclass(frozen=True, slots=True)
class Ruling:
    """What the policy says of a call, and which rule said it."""

    verdict: PolicyVerdict
    rule: str
    # Why a call is refused, when no rule of the user's refused it.
    reason: str | None = None

    def shown(self) -> dict[str, str]:
        """As the `tool_call` event and the call log carry it."""
        return {"rule": self.rule, "decision": self.verdict.value}

    @property
    def refusal(self) -> str | None:
        """What the model reads of a refused call (None for one that is not)."""
        if self.verdict is not PolicyVerdict.DENY:
            return None
        if self.reason is not None:
            return self.reason
        return f"not allowed for this user (policy rule '{self.rule}'); it was not run"


@dataclass(frozen=True, slots=True)
class Policy:
    rules: tuple[PolicyRule, ...] = ()
    users: Mapping[str, UserRules] = field(default_factory=dict)

    def needs_area(self, owner: str | None) -> bool:
        denied = self.users.get(owner or "", UserRules()).deny
        return any(rule.needs_area for rule in (*self.rules, *denied))

    def rule(self, subject: Subject, owner: str | None, settings: Settings) -> Ruling:
        """The ruling on one subject (see the module docstring for the order)."""
        for n, match in enumerate(self.users.get(owner or "", UserRules()).deny):
            if _matches(match, subject, closed=True):
                return Ruling(PolicyVerdict.DENY, match.name or f"users.{owner}.deny[{n}]")
        if subject.tool in settings.auto_approve_tool_names():
            return Ruling(PolicyVerdict.ALLOW, "BERNARD_AUTO_APPROVE_TOOLS")
        if subject.tool in settings.confirm_tool_names():
            return Ruling(PolicyVerdict.ASK, "BERNARD_CONFIRM_TOOLS")
        for n, rule in enumerate(self.rules):
            if _matches(rule, subject, closed=rule.decision != "allow"):
                return Ruling(PolicyVerdict(rule.decision), rule.name or f"rules[{n}]")
        return Ruling(PolicyVerdict.ASK if subject.declared else PolicyVerdict.ALLOW, DECLARED)

    def rule_all(
        self, subjects: Sequence[Subject], owner: str | None, settings: Settings
    ) -> Ruling:
        """The strictest ruling on `subjects` (the first of the strictest)."""
        rulings = [self.rule(subject, owner, settings) for subject in subjects]
        return max(rulings, key=lambda ruling: _STRICTNESS[ruling.verdict])


def _matches(match: Match, subject: Subject, *, closed: bool) -> bool:
    """Whether `subject` is what `match` names; `closed`: an area not known matches."""
    pairs = (
        (match.tool, subject.tool),
        (match.server, subject.server),
        (match.domain, subject.domain),
        (match.service, subject.service),
        (match.entity, subject.entity),
    )
    for globs, value in pairs:
        if globs is not None and (value is None or not _any_glob(globs, value)):
            return False
    if match.area is not None:
        if not subject.area_known:
            if not closed:
                return False
        elif subject.area is None or not any(_any_glob(match.area, a) for a in subject.area):
            return False
    for option, (low, high) in (match.within or {}).items():
        if option not in subject.options:
            continue
        number = as_number(subject.options[option])
        if number is None or not low <= number <= high:
            return False
    return True


def _any_glob(globs: Sequence[str], value: str) -> bool:
    folded = value.casefold()
    return any(fnmatch.fnmatchcase(folded, glob.casefold()) for glob in globs)


def parse_policy(text: str, where: str) -> Policy:
    """The policy a TOML text says; `PolicyError` naming `where` and what is wrong."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"the policy file {where} is not TOML: {exc}") from None
    try:
        parsed = PolicyFile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'the file'}: {err['msg']}"
            for err in exc.errors()[:5]
        )
        raise PolicyError(f"the policy file {where} is not a policy: {problems}") from None
    for rule in (*parsed.rules, *(m for u in parsed.users.values() for m in u.deny)):
        for low, high in (rule.within or {}).values():
            if low > high:
                raise PolicyError(
                    f"the policy file {where}: rule '{rule.name}' bounds an option from "
                    f"{low:g} to {high:g}"
                )
    return Policy(parsed.rules, parsed.users)


@lru_cache(maxsize=16)
def load_policy(path: str | None) -> Policy:
    """The policy of the file at `path` (None: the household default), read once."""
    if path is None:
        text = resources.files("worker.tools").joinpath("policy.toml").read_text("utf-8")
        return parse_policy(text, "worker/tools/policy.toml")
    try:
        text = Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(
            f"the policy file {path} (BERNARD_POLICY_FILE) cannot be read: {exc}"
        ) from None
    return parse_policy(text, path)


def policy_of(settings: Settings) -> Policy:
    return load_policy(settings.policy_file or None)


def requires_confirmation(tool: BaseTool, settings: Settings) -> bool:
    """Whether a call of `tool` may wait for the user's decision, by the tool's own word and
    the tool-name rules (what `GET /v1/status` lists; a call is ruled on by `rule_on`)."""
    if tool.name in settings.auto_approve_tool_names():
        return False
    if tool.name in settings.confirm_tool_names():
        return True
    return bool((tool.metadata or {}).get("requires_confirmation"))


def _own_subject(tool: BaseTool, args: dict[str, Any]) -> Subject:
    metadata = tool.metadata or {}
    server = metadata.get("mcp_server")
    return Subject(
        tool=tool.name,
        declared=bool(metadata.get("requires_confirmation")),
        server=server if isinstance(server, str) else None,
        options=args,
    )


async def rule_on(
    tool: BaseTool,
    args: dict[str, Any],
    *,
    settings: Settings,
    runtime: ToolRuntime | None,
) -> Ruling:
    """The ruling on a call of `tool` with `args` (arguments that fit its schema) for the
    turn's user. What the call acts on is read within `BERNARD_TOOL_TIMEOUT_S`; a call whose
    subjects cannot be read is refused, rule "unreadable" (never let through on a guess)."""
    policy = policy_of(settings)
    owner = runtime.owner if runtime is not None else None
    subjects_of = (tool.metadata or {}).get("policy_subjects")
    subjects: list[Subject] = []
    if callable(subjects_of):
        config = runtime_config(runtime, {})
        try:
            async with asyncio.timeout(settings.tool_timeout_s):
                subjects = list(await subjects_of(args, config, policy.needs_area(owner)))
        except Exception as exc:
            said = str(exc).removeprefix("Error: ") or type(exc).__name__
            why = f"what this call acts on could not be read ({said}); it was not run"
            return Ruling(PolicyVerdict.DENY, "unreadable", why)
    return policy.rule_all(subjects or [_own_subject(tool, args)], owner, settings)
