from corral.worker.runtime import main

main()
