"""``python -m webhook.cli``: ``retry-webhook``."""

import sys

from webhook.cli import main

sys.exit(main())
