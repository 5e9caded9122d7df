from kvstack.cli import main

raise SystemExit(main())
