"""`python -m tfcli` runs the command line, exactly like the `tfcli` script."""

from tfcli.cli.app import main

if __name__ == "__main__":
    main()
