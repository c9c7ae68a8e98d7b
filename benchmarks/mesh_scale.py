"""Mesh protocols at scale, simulated: otela's own cores on a modelled network.

Each scenario runs on a fresh, seeded federation (``simulator/mesh``; deterministic for a
seed: the script runs itself with ``PYTHONHASHSEED=0`` unless one is set, since the cores
iterate over sets of peer ids, whose order Python's per-process string hashing changes,
and two runs of a seed differed slightly) and prints one JSON line of figures: see
docs/scale.md for the model, the calibration against the real-process benchmarks and the
tables.

Run:  nice -n 10 .venv/bin/python benchmarks/mesh_scale.py --nodes 64 1000 \
          --scenarios idle change kill
      --host-cores 2 puts every node on one 2-core host (the real-process benchmarks' setup)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import logging

from simulator.mesh.gossip import PUSHES, WIRES
from simulator.mesh.network import NetConfig
from simulator.mesh.scenarios import SCENARIOS, THIN
from simulator.mesh.world import World


def main() -> None:
    if "PYTHONHASHSEED" not in os.environ:  # the same order of sets in every run of a seed
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[64])
    parser.add_argument("--scenarios", nargs="+", default=["idle", "change", "kill"],
                        choices=sorted(SCENARIOS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--continents", type=int, default=1)
    parser.add_argument("--host-cores", type=int, default=0,
                        help="every node on one host with this many cores (0: a core each)")
    parser.add_argument("--ingresses", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=None,
                        help="simulated minutes of the churn and flaky scenarios, "
                        "or how long the partition scenario's region stays cut off")
    parser.add_argument("--cut-share", type=float, default=0.1,
                        help="the partition scenario's region: this share of the sites")
    parser.add_argument("--nat-share", type=float, default=0.0,
                        help="share of nodes behind NAT, reached through the relays")
    parser.add_argument("--relays", type=int, default=0, help="public relays (the first nodes)")
    parser.add_argument("--wire", choices=sorted(WIRES), default="signed",
                        help="what GossipSub puts around otela's data: 'signed' is the "
                        "daemon's, 'peer-record' the daemon's before issue 38's churn fix "
                        "(every RPC with the sender's signed peer record), 'unsigned' and "
                        "'idontwant' (GossipSub 1.2 as py-libp2p 0.8.1 runs it) what-ifs "
                        "(docs/scale.md)")
    parser.add_argument("--gossip-degree", type=int, nargs=4, default=None,
                        metavar=("D", "D_LO", "D_HI", "D_LAZY"),
                        help="a what-if GossipSub mesh (the daemon's: 6 4 12 6)")
    parser.add_argument("--push", choices=PUSHES, default="mesh",
                        help="how gossip forwards: 'mesh' is GossipSub's (the daemon's), "
                        "'tree' a what-if: Plumtree's lazy push on the same mesh "
                        "(docs/scale.md)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the simulated nodes' own warnings (suspicions, ...)
    for n in args.nodes:
        for name in args.scenarios:
            net = NetConfig(continents=args.continents, loss=args.loss,
                            nat_share=args.nat_share, relays=args.relays)
            if args.host_cores:
                net.cores_per_host, net.nodes_per_host = args.host_cores, n + 64
            started = time.process_time()
            world = World(n, seed=args.seed, net=net, ingresses=args.ingresses,
                          wire=WIRES[args.wire],
                          degree=tuple(args.gossip_degree) if args.gossip_degree else None,
                          push=args.push)
            if name in THIN:
                world.seed_thin()
            else:
                world.seed_state()
            kwargs: dict[str, float] = {}
            if args.minutes and name in ("churn", "flaky"):
                kwargs["minutes"] = args.minutes
            elif args.minutes and name == "partition":
                kwargs["cut_for"] = 60 * args.minutes
            if name == "partition":
                kwargs["share"] = args.cut_share
            figures = SCENARIOS[name](world, **kwargs)
            print(json.dumps({
                "nodes": n, "scenario": name, "wire": args.wire,
                **({"degree": args.gossip_degree} if args.gossip_degree else {}),
                **({"push": args.push} if args.push != "mesh" else {}),
                **{k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()},
                "simulated_s": round(world.loop.now, 1),
                "cpu_s": round(time.process_time() - started, 1),
                "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            }), flush=True)


if __name__ == "__main__":
    main()
