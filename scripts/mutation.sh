#!/usr/bin/env bash
# Mutation check (not in CI): put curated one-line bugs back one at a time on a temporary
# copy of the tree and run the tests that should catch each. See scripts/mutation.py and
# docs/testing.md. Examples:
#   bash scripts/mutation.sh --check            # only verify every mutant's snippet exists
#   bash scripts/mutation.sh --backend local    # the local-backend mutants (~15 min)
#   bash scripts/mutation.sh                    # all (Ray/Slurm ones take their locks)
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" scripts/mutation.py "$@"
