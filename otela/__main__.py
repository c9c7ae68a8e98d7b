from otela.cli import main

main()
