"""A worker module written the way AReaL's are: it parses AReaL's command line with
argparse (all arguments required, so a missing one exits with status 2), writes what it
got next to the logs, then runs corral's worker (the contract in corral.worker.args)."""

from __future__ import annotations

import argparse
import json
import os

from corral.worker.runtime import main as corral_worker_main

parser = argparse.ArgumentParser()
parser.add_argument("--host", default="0.0.0.0")
for name in (
    "--port", "--experiment-name", "--trial-name", "--role", "--worker-index",
    "--name-resolve-type", "--nfs-record-root", "--etcd3-addr", "--fileroot",
):  # fmt: skip
    parser.add_argument(name, required=True)
args = parser.parse_args()
record = os.path.join(os.environ["CORRAL_LOG_DIR"], f"argv-{args.role}-{args.worker_index}.json")
with open(record, "w") as fh:
    json.dump(vars(args), fh)
corral_worker_main()
