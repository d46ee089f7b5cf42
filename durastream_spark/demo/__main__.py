from durastream_spark.demo.cli import main

raise SystemExit(main())
