"""The command line: thin typer commands that check arguments, call one library function and render.

Modules here import only typer, pathlib and tfcli.cli.* at the top; the engine is imported inside the
command bodies, so `tfcli --help` never pays for torch.
"""
