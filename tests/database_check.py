"""ComfyUI's database set-up (app/database/db.py init_db) with one database URL, then a garbage
collection on a thread other than the one that ran it, as ComfyUI's execution thread collects
after prompts. Prints JSON: the error lines SQLAlchemy logged (its pool finalizing the
connection init_db left behind). Run by tests/test_harness_database.py under a ComfyUI's Python.

usage: python tests/database_check.py COMFY_DIR DATABASE_URL
"""

import gc
import json
import logging
import sys
import threading

tree, url = sys.argv[1], sys.argv[2]
sys.path.insert(0, tree)
sys.argv = [sys.argv[0]]


class Errors(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.lines = []

    def emit(self, record):
        self.lines.append(self.format(record).splitlines()[-1] if record.exc_info else record.getMessage())


errors = Errors()
logging.getLogger().addHandler(errors)
from comfy.cli_args import args  # noqa: E402

args.database_url = url
from app.database.db import dependencies_available, init_db  # noqa: E402

gc.disable()  # the collection below is the first after init_db, and on another thread
init_db()
collector = threading.Thread(target=gc.collect)
collector.start()
collector.join()
print(json.dumps({"dependencies": dependencies_available(), "errors": errors.lines}))
