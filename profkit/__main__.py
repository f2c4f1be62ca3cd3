from profkit.cli import entry

entry()
