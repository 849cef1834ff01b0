from tickwire.cli import main

raise SystemExit(main())
