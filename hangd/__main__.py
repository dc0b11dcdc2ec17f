import sys

from hangd.cli import main

sys.exit(main())
