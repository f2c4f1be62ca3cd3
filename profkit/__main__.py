from profkit.cli import main

main(prog_name="profkit")
