from corral.bench import main

main()
