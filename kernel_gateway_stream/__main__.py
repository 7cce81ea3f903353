from kernel_gateway_stream.app import main

main()
