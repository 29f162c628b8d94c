from hetero_dp.cli import main

main()
