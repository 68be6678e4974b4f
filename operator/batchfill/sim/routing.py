"""How a Service spreads requests over a fleet's Ready replicas (``FleetConfig.balancing``).

* ``round-robin``: request ``i`` goes to replica ``i mod n``, in arrival order (an L7 balancer's round robin).
  Each replica then gets every ``n``-th arrival of the fleet: for Poisson traffic its gaps are Erlang-``n``,
  far smoother than Poisson when ``n`` is large, so many small replicas queue less than one replica would at
  the same per-replica rate.
* ``random``: an independent uniform pick per request, as kube-proxy's iptables mode picks an endpoint at random
  for each new connection (https://kubernetes.io/docs/reference/networking/virtual-ips/) with many clients.
  Each replica's share of Poisson traffic stays Poisson, which is what the plan's capacity at SLA assumes.

Pure: the picks come from the generator passed in.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

ROUND_ROBIN = "round-robin"
RANDOM = "random"
BALANCING = (ROUND_ROBIN, RANDOM)


def random_shares(arrivals: npt.NDArray[np.float64], n: int, rng: np.random.Generator) -> list[npt.NDArray[np.float64]]:
    """``arrivals`` (sorted) dealt to ``n`` >= 1 replicas by an independent uniform pick per request; each share
    stays sorted."""
    pick = rng.integers(0, n, size=len(arrivals))
    order = np.argsort(pick, kind="stable")
    return np.split(arrivals[order], np.cumsum(np.bincount(pick, minlength=n))[:-1])
