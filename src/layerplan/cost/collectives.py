"""Communication schemes, one small class each with one method: ``cost(size_bytes, n) -> CollectiveCost``.

A ``CollectiveCost`` is the α-β account of one collective over ``n`` nodes of one message size S:

- ``rounds``: messages on the critical path; the latency term is ``rounds · latency_s``.
- ``critical_bytes``: bytes that cross one NIC one after another on the critical path; the
  bandwidth term is ``critical_bytes / payload_bandwidth``. For schemes where every round is a
  simultaneous exchange (point to point, ring, butterfly, recursive doubling on a power of 2) it is
  ``max(send, recv)`` of a node. It is larger where a node's sends and receives happen in different
  phases and so cannot use the two directions of its full-duplex NIC at once: a tree or one-to-all
  reduces first (receive) and broadcasts after (send), and recursive doubling on a non-power of 2
  has a receive-only fold-in round and a send-only last round. Using ``max(send, recv)`` there
  would contradict the papers' closed forms (PALEO §2 tree ``2·log2(K)·T``, Stanza's ``R(n)``).
- ``send_bytes_per_node`` / ``recv_bytes_per_node``: what the busiest participant sends and
  receives (the root of a gather, a tree or one-to-all; every node of a ring). The engine uses
  them, relative to ``critical_bytes``, as the load the collective puts on each direction of a NIC.
- ``total_bytes``: bytes sent, summed over all participants (what the network carries).

``time_s(bandwidth, latency) = rounds·latency + critical_bytes/bandwidth``. ``n = 1`` costs nothing.
Sizes in bytes, rates in bytes/s, times in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from layerplan.errors import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveCost:
    """The α-β cost of one collective (see the module docstring for each field's meaning)."""

    rounds: int
    """Messages on the critical path (latency term = rounds · latency_s)."""
    send_bytes_per_node: float
    """Bytes the busiest participant sends."""
    recv_bytes_per_node: float
    """Bytes the busiest participant receives."""
    total_bytes: float
    """Bytes sent by all participants together."""
    critical_bytes: float
    """Bytes serialised through one NIC on the critical path (bandwidth term = critical_bytes / B)."""

    def time_s(self, bandwidth_bytes_per_s: float, latency_s: float = 0.0) -> float:
        """α-β time on links of this payload bandwidth and per-message latency."""
        if self.critical_bytes == 0 and self.rounds == 0:
            return 0.0
        return self.rounds * latency_s + self.critical_bytes / bandwidth_bytes_per_s  # PALEO §2: T = |D|/B per message


ZERO = CollectiveCost(rounds=0, send_bytes_per_node=0.0, recv_bytes_per_node=0.0, total_bytes=0.0, critical_bytes=0.0)


def _check(size_bytes: float, n: int) -> None:
    if size_bytes < 0:
        raise ConfigError(f"a collective's message size must be non-negative, got {size_bytes!r} bytes")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"a collective needs at least 1 participant, got {n!r}")


def log2_ceil(n: int) -> int:
    """⌈log2 n⌉ for n ≥ 1 (0 for n = 1)."""
    return (n - 1).bit_length()


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def recursive_doubling_rounds(n: int) -> int:
    """Stanza §4's R(n): log2 n for a power of 2, else ⌊log2 n⌋ + 2 (the surplus nodes fold in
    first and get the result last); 0 for a single node."""
    if n <= 1:
        return 0
    floor_log = n.bit_length() - 1
    return floor_log if is_power_of_two(n) else floor_log + 2  # Stanza §4 R(n)


# ---- point to point and rooted schemes ----------------------------------------------------------
class PointToPoint:
    """One message of S bytes from one node to another (PALEO §2: T = |D|/B)."""

    name = "p2p"

    def cost(self, size_bytes: float, n: int = 2) -> CollectiveCost:
        _check(size_bytes, n)
        if n == 1:
            return ZERO
        s = float(size_bytes)
        # PALEO §2: T = |D|/B
        return CollectiveCost(rounds=1, send_bytes_per_node=s, recv_bytes_per_node=s, total_bytes=s, critical_bytes=s)


class Gather:
    """ManyToOne: each of the n−1 other nodes sends S bytes to the root.

    Rounds = 1: the n−1 messages are in flight at once, so their latencies overlap; the root's
    ingress serialises the (n−1)·S bytes (the bandwidth term)."""

    name = "gather"

    def cost(self, size_bytes: float, n: int) -> CollectiveCost:
        _check(size_bytes, n)
        if n == 1:
            return ZERO
        s = float(size_bytes)
        # PALEO §2 one-to-all, its gather half: the root's ingress carries (n−1)·S
        return CollectiveCost(rounds=1, send_bytes_per_node=s, recv_bytes_per_node=(n - 1) * s,
                              total_bytes=(n - 1) * s, critical_bytes=(n - 1) * s)


class Scatter:
    """OneToMany: the root sends S bytes to each of the n−1 other nodes (a broadcast when the S
    bytes are the same). Rounds = 1, as for ``Gather``."""

    name = "scatter"

    def cost(self, size_bytes: float, n: int) -> CollectiveCost:
        _check(size_bytes, n)
        if n == 1:
            return ZERO
        s = float(size_bytes)
        # PALEO §2 one-to-all, its broadcast half: the root's egress carries (n−1)·S
        return CollectiveCost(rounds=1, send_bytes_per_node=(n - 1) * s, recv_bytes_per_node=s,
                              total_bytes=(n - 1) * s, critical_bytes=(n - 1) * s)


ManyToOne = Gather
OneToMany = Scatter


# ---- all-reduce ----------------------------------------------------------------------------------
class OneToAllAllReduce:
    """All-reduce through one root (PALEO §2 OneToAll, ``2·K·T``): gather every gradient at the root,
    then send the sum back. Both phases are one round each; the root receives (n−1)·S then sends
    (n−1)·S, one phase after the other. PALEO's ``2·K·T`` counts K workers besides a separate
    master: that is n = K + 1 participants here."""

    name = "one_to_all"

    def cost(self, size_bytes: float, n: int) -> CollectiveCost:
        _check(size_bytes, n)
        if n == 1:
            return ZERO
        s = float(size_bytes)
        return CollectiveCost(rounds=2, send_bytes_per_node=(n - 1) * s, recv_bytes_per_node=(n - 1) * s,
                              total_bytes=2 * (n - 1) * s, critical_bytes=2 * (n - 1) * s)  # PALEO §2 OneToAll: 2·K·T


class TreeAllReduce:
    """Reduce up a binomial tree, then broadcast down it (PALEO §2 Tree AllReduce, ``2·log2(K)·T``):
    ⌈log2 n⌉ levels each way, one message of S per level. The root receives ⌈log2 n⌉·S during the
    reduce and sends ⌈log2 n⌉·S during the broadcast."""

    name = "tree"

    def cost(self, size_bytes: float, n: int) -> CollectiveCost:
        _check(size_bytes, n)
        if n == 1:
            return ZERO
        s, levels = float(size_bytes), log2_ceil(n)
        return CollectiveCost(rounds=2 * levels, send_bytes_per_node=levels * s, recv_bytes_per_node=levels * s,
                              total_bytes=2 * (n - 1) * s, critical_bytes=2 * levels * s)  # PALEO §2 Tree: 2·log2(K)·T


class ButterflyAllReduce:
    """Butterfly all-reduce (PALEO §2, ``log2(K)·T``): ⌈log2 n⌉ rounds, in each every node exchanges
    the full S with a partner (send and receive at once, full duplex). PALEO's idealisation: for a
    non-power of 2 it keeps ⌈log2 n⌉ rounds; ``RecursiveDoubling`` charges the fold-in rounds."""

    name = "butterfly"

    def cost(self, size_bytes: float, n: int) -> CollectiveCost:
        _check(size_bytes, n)
        if n == 1:
            return ZERO
        s, r = float(size_bytes), log2_ceil(n)
        return CollectiveCost(rounds=r, send_bytes_per_node=r * s, recv_bytes_per_node=r * s,
                              total_bytes=n * r * s, critical_bytes=r * s)  # PALEO §2 Butterfly: log2(K)·T


class RingAllReduce:
    """Ring all-reduce (reduce-scatter then all-gather): 2(n−1) rounds, in each every node sends S/n
    to its successor and receives S/n from its predecessor. Each node sends 2(n−1)/n·S; all nodes
    together 2·S·(n−1) (RALP: Horovod moves 2·S·(W−1))."""

    name = "ring"

    def cost(self, size_bytes: float, n: int) -> CollectiveCost:
        _check(size_bytes, n)
        if n == 1:
            return ZERO
        s = float(size_bytes)
        per_node = 2 * (n - 1) / n * s  # RALP §2: ring moves 2·S·(W−1) in total, 2(W−1)/W·S per node
        return CollectiveCost(rounds=2 * (n - 1), send_bytes_per_node=per_node, recv_bytes_per_node=per_node,
                              total_bytes=2 * (n - 1) * s, critical_bytes=per_node)


class RecursiveDoubling:
    """Recursive doubling all-reduce (Stanza §4): R(n) rounds, each moving the full S. For a
    non-power of 2, p = 2^⌊log2 n⌋ nodes do the log2 p exchanges; each of the r = n − p surplus
    nodes first sends its S to a partner (a receive-only round for the partner) and gets the result
    back last (a send-only round): a partner sends and receives (log2 p + 1)·S, the critical path
    is R(n)·S."""

    name = "recursive_doubling"

    def cost(self, size_bytes: float, n: int) -> CollectiveCost:
        _check(size_bytes, n)
        if n == 1:
            return ZERO
        s = float(size_bytes)
        rounds = recursive_doubling_rounds(n)  # Stanza §4 R(n)
        p = 1 << (n.bit_length() - 1)
        surplus = n - p
        log_p = p.bit_length() - 1
        busiest = (log_p + (1 if surplus else 0)) * s
        return CollectiveCost(rounds=rounds, send_bytes_per_node=busiest, recv_bytes_per_node=busiest,
                              total_bytes=(2 * surplus + p * log_p) * s, critical_bytes=rounds * s)  # Stanza eq.3: P_c·R(n)/B


# ---- sharded parameter servers -------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class ShardedPSCost(CollectiveCost):
    """A push/pull through sharded parameter servers, with each side's bytes."""

    worker_send_bytes: float
    """P: a worker pushes P/n_s to each of the n_s servers."""
    worker_recv_bytes: float
    """P: a worker pulls P/n_s back from each server."""
    server_send_bytes: float
    """n_w·P/n_s: a server sends its shard to every worker."""
    server_recv_bytes: float
    """n_w·P/n_s: a server receives its shard's gradient from every worker."""


class ShardedPS:
    """Push gradients to and pull parameters from n_s sharded servers (Stanza eq.6 / Yan §4.2): each
    of the n_w workers sends P/n_s bytes to each server and receives P/n_s back from each. The push
    finishes before the pull starts (the servers update in between), so a NIC's two directions are
    used one after the other: the critical path is 2·max(P, n_w·P/n_s), which is Stanza eq.6's
    2·n_w·P/(n_s·B) when n_w ≥ n_s (the servers' NICs are the bottleneck)."""

    name = "sharded_ps"

    def __init__(self, servers: int = 1) -> None:
        if not isinstance(servers, int) or servers < 1:
            raise ConfigError(f"sharded PS needs at least 1 server, got {servers!r}")
        self.servers = servers

    def cost(self, size_bytes: float, n: int) -> ShardedPSCost:
        """``size_bytes`` = P (the whole model), ``n`` = n_w workers."""
        _check(size_bytes, n)
        p, n_s = float(size_bytes), self.servers
        server = n * p / n_s  # Stanza eq.6: a server moves n_w·P/n_s each way
        return ShardedPSCost(rounds=2, send_bytes_per_node=max(p, server), recv_bytes_per_node=max(p, server),
                             total_bytes=2 * n * p, critical_bytes=2 * max(p, server),  # Stanza eq.6: 2·n_w·P/(n_s·B)
                             worker_send_bytes=p, worker_recv_bytes=p, server_send_bytes=server, server_recv_bytes=server)


ALLREDUCE: dict[str, RingAllReduce | TreeAllReduce | ButterflyAllReduce | RecursiveDoubling | OneToAllAllReduce] = {
    "ring": RingAllReduce(),
    "tree": TreeAllReduce(),
    "butterfly": ButterflyAllReduce(),
    "recursive_doubling": RecursiveDoubling(),
    "one_to_all": OneToAllAllReduce(),
}
"""All-reduce algorithms by name (a strategy's ``algorithm`` config)."""

SCHEMES: dict[str, object] = {**ALLREDUCE, "p2p": PointToPoint(), "gather": Gather(), "scatter": Scatter()}
"""Every scheme an engine ``Collective`` may name (all over one group of nodes)."""


def collective_cost(scheme: str, size_bytes: float, n: int) -> CollectiveCost:
    """The cost of ``scheme`` (a ``SCHEMES`` name) for ``size_bytes`` over ``n`` nodes."""
    try:
        s = SCHEMES[scheme]
    except KeyError:
        raise ConfigError(f"unknown collective scheme {scheme!r}; known: {', '.join(SCHEMES)}") from None
    return s.cost(size_bytes, n)  # type: ignore[attr-defined]


def allreduce_time_s(scheme: str, size_bytes: float, n: int, bandwidth_bytes_per_s: float, latency_s: float = 0.0) -> float:
    """Closed-form time of one all-reduce alone on the network."""
    if scheme not in ALLREDUCE:
        raise ConfigError(f"unknown all-reduce algorithm {scheme!r}; known: {', '.join(ALLREDUCE)}")
    return ALLREDUCE[scheme].cost(size_bytes, n).time_s(bandwidth_bytes_per_s, latency_s)


__all__ = [
    "ALLREDUCE", "SCHEMES", "ZERO", "ButterflyAllReduce", "CollectiveCost", "Gather", "ManyToOne", "OneToAllAllReduce",
    "OneToMany", "PointToPoint", "RecursiveDoubling", "RingAllReduce", "Scatter", "ShardedPS", "ShardedPSCost",
    "TreeAllReduce", "allreduce_time_s", "collective_cost", "is_power_of_two", "log2_ceil", "recursive_doubling_rounds",
]
