"""The devices behind the guides' shell blocks (run by tests/test_doc_blocks.py).

A guide shows ``calmkit collection create``, then (pages later, in the apps) devices
report, then ``calmkit query``. When a block runs in the test suite, this module plays
the devices: right after each ``collection create`` it submits the reports of a
synthetic population of ``USERS`` users with the real client, using the submit token the
command printed and the connection options the command was given. A collection created
with ``--admission`` gets no reports (its devices would need tickets from the app's
backend).

Usage: ``python -m tests.doc_devices CREATE_OUTPUT ARG...`` (the arguments of
``calmkit collection create ...``, from ``collection`` on).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

USERS = 2000
TOKEN = re.compile(r"submit token \(shown once; give it to your apps\): (\S+)")


def _options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(add_help=False)
    for name in ("--address", "--tls-ca", "--collection", "--domain", "--admission"):
        parser.add_argument(name, default=None)
    args, _ = parser.parse_known_args(argv)
    return args


def main(argv: list[str]) -> int:
    from calmkit_client import Collector, DeviceState
    from calmkit_simulator import synthetic_population

    output, args = argv[0], _options(argv[1:])
    if args.admission is not None or args.domain is None:
        print("doc devices: no reports (admission tickets, or no --domain)", file=sys.stderr)
        return 0
    found = TOKEN.search(output)
    assert found is not None, f"collection create printed no submit token:\n{output}"
    sizes = tuple(int(s) for s in args.domain.split(","))
    pop = synthetic_population(n=USERS, sizes=sizes, rng=0)
    ca = None if args.tls_ca is None else Path(args.tls_ca).read_bytes()
    address = args.address or "127.0.0.1:50051"
    with Collector(
        address,
        args.collection,
        found.group(1),
        state=DeviceState.in_memory(),
        root_certificates=ca,
    ) as collector:
        ack = collector.submit_many(pop.codes, np.arange(USERS))
    assert ack.accepted == USERS, ack
    print(f"doc devices: {ack.accepted} reports accepted", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
