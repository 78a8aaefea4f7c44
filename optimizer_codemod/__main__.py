from optimizer_codemod.cli import main

main(prog_name="optcodemod")
