"""``python -m plitzer`` is the ``plitzer`` command."""

from plitzer.cli import main

raise SystemExit(main())
