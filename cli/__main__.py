from cli.main import app

app()
