from bench.gpu.main import main

raise SystemExit(main())
