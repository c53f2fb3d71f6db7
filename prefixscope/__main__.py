from prefixscope.cli import main

raise SystemExit(main())
