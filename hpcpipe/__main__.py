import sys

from hpcpipe.cli.main import main

sys.exit(main())
