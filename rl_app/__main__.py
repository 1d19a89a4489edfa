from rl_app.cli import run

run()
