from polarproxy.cli import main

main()
