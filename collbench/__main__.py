from collbench.cli import main

raise SystemExit(main())
