from popkit.cli import main

main()
