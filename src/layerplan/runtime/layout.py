"""Which rank plays which role — the one place that decides it.

Layouts (world size in brackets):

- ``ps`` [n_w + n_s]: ranks 0..n_w−1 are workers, ranks n_w..n_w+n_s−1 parameter servers; server j
  owns the j-th contiguous shard of the flattened parameter vector, balanced by element count.
- ``allreduce`` [n]: ranks 0..n−1 are DDP workers.
- ``stanza`` [n_c + n_f]: ranks 0..n_c−1 CONV workers, ranks n_c..n_c+n_f−1 FC workers. CONV
  workers are split evenly among FC workers in **contiguous blocks**: FC worker j serves CONV
  workers ⌊j·n_c/n_f⌋ .. ⌊(j+1)·n_c/n_f⌋−1. Contiguous (rather than i mod n_f) so an FC worker's
  concatenation of its CONV workers' activations, in rank order, is a contiguous slice of the
  global batch.
- ``hybrid`` [n_c + n_f]: ranks 0..n_c−1 CONV workers (data parallel over the conv phase), ranks
  n_c..n_c+n_f−1 FC machines (the FC phase, each fc layer partitioned by output features over
  them or replicated on each). Rows of the global batch in the **batch layout** (where a replicated
  layer runs and the loss is computed) go to FC machines in the same contiguous blocks of CONV
  workers as Stanza's: FC machine j holds the samples of CONV workers ⌊j·n_c/n_f⌋ ..
  ⌊(j+1)·n_c/n_f⌋−1 (none when n_f > n_c and its block is empty). A partitioned layer's slice j
  is output features ⌊j·F/n_f⌋ .. ⌊(j+1)·F/n_f⌋−1 of its F outputs (``feature_slices``).
- ``ralp`` [n_w + 1]: ranks 0..n_w−1 workers, rank n_w the PS worker (tail + head aggregation).
  The RALP setting only says how many nodes the run stands for: RALP-N uses N = n_w + 1 nodes,
  RALP-H N = 2·n_w (the paper's N/2 workers + 1 PS GPU).
- ``groups`` [N + 2] (Omnivore §IV-A, §V-A, as ``strategies/groups.py`` schedules it): ranks
  0..N−1 are conv machines, in g **contiguous** groups of k = N/g (group j: ranks j·k .. j·k+k−1,
  so a group batch — its machines' samples in rank order — is a contiguous slice of each global
  batch); rank N is the merged FC server (FC compute and FC model on one machine: FC staleness 0);
  rank N+1 the conv model server, its own node as in the engine's schedule (the paper places it
  on one of the conv machines). Every conv machine talks to both servers directly: it receives the
  conv model from and pushes its gradient to the conv model server (which sums the k gradients of
  a group), and sends its activations to / gets their gradients from the FC server.

Data workers — the ranks that read input samples, in data order — are the ps/allreduce/ralp
workers, the Stanza and hybrid CONV workers and the groups conv machines; data worker i reads
slice i of every global batch (groups: of every round — group j's iteration s reads its machines'
slices of global batch s).
"""

from __future__ import annotations

from dataclasses import dataclass

from layerplan.errors import ConfigError

MAX_LOCAL_RANKS = 64  # more processes than this on one machine is a typo, not an experiment


@dataclass(frozen=True, kw_only=True, slots=True)
class Role:
    """One rank's part in a run."""

    rank: int
    kind: str
    """worker | server | conv_worker | fc_worker | ps_worker | conv_machine | fc_server |
    conv_model_server."""
    index: int
    """Position among the ranks of the same kind."""
    data_index: int | None = None
    """Which slice of each global batch this rank reads (None: it reads no inputs)."""
    peers: tuple[int, ...] = ()
    """stanza CONV worker: (its FC worker,); FC worker: its CONV workers in batch order;
    hybrid CONV worker: (the FC machine holding its samples in the batch layout, then the other
    FC machines); FC machine: the CONV workers of its batch-layout block in batch order; ralp worker: (the PS worker,); ps worker: the servers;
    server: the workers; groups conv machine: (the FC server, the conv model server); groups
    servers: the conv machines."""
    group: int | None = None
    """groups conv machine: its compute group (0..g−1)."""

    def to_dict(self) -> dict:
        return {"rank": self.rank, "kind": self.kind, "index": self.index, "data_index": self.data_index,
                "peers": list(self.peers), "group": self.group}


def layout(spec) -> dict[int, Role]:
    """rank → Role for ``spec`` (a RunSpec); ConfigError for configurations that make no sense."""
    c = spec.config
    s = spec.strategy
    roles: dict[int, Role] = {}
    if s == "ps":
        nw, ns = c["workers"], c["servers"]
        servers = tuple(range(nw, nw + ns))
        workers = tuple(range(nw))
        for r in workers:
            roles[r] = Role(rank=r, kind="worker", index=r, data_index=r, peers=servers)
        for j, r in enumerate(servers):
            roles[r] = Role(rank=r, kind="server", index=j, peers=workers)
    elif s == "allreduce":
        for r in range(c["workers"]):
            roles[r] = Role(rank=r, kind="worker", index=r, data_index=r)
    elif s == "stanza":
        nc, nf = c["conv_workers"], c["fc_workers"]
        if nf > nc:
            raise ConfigError(f"stanza: {nf} FC workers for {nc} CONV workers — every FC worker needs at least one "
                              "CONV worker (fc_workers <= conv_workers)")
        for j in range(nf):
            block = tuple(range(j * nc // nf, (j + 1) * nc // nf))
            roles[nc + j] = Role(rank=nc + j, kind="fc_worker", index=j, peers=block)
            for i in block:
                roles[i] = Role(rank=i, kind="conv_worker", index=i, data_index=i, peers=(nc + j,))
    elif s == "hybrid":
        nc, nf = c["conv_workers"], c["fc_workers"]
        fcs = tuple(range(nc, nc + nf))
        for j in range(nf):
            block = tuple(range(j * nc // nf, (j + 1) * nc // nf))
            roles[nc + j] = Role(rank=nc + j, kind="fc_worker", index=j, peers=block)
            for i in block:
                roles[i] = Role(rank=i, kind="conv_worker", index=i, data_index=i,
                                peers=(nc + j, *(f for f in fcs if f != nc + j)))
    elif s == "ralp":
        nw = c["workers"]
        for r in range(nw):
            roles[r] = Role(rank=r, kind="worker", index=r, data_index=r, peers=(nw,))
        roles[nw] = Role(rank=nw, kind="ps_worker", index=0, peers=tuple(range(nw)))
    elif s == "groups":
        n, g = c["machines"], c["groups"]
        k = n // g
        fc, conv_model = n, n + 1
        for r in range(n):
            roles[r] = Role(rank=r, kind="conv_machine", index=r, data_index=r, peers=(fc, conv_model), group=r // k)
        roles[fc] = Role(rank=fc, kind="fc_server", index=0, peers=tuple(range(n)))
        roles[conv_model] = Role(rank=conv_model, kind="conv_model_server", index=0, peers=tuple(range(n)))
    else:  # RunSpec rejects these already
        raise ConfigError(f"unknown strategy {s!r}")
    if len(roles) > MAX_LOCAL_RANKS:
        raise ConfigError(f"{s}: {len(roles)} ranks is more than makes sense here (at most {MAX_LOCAL_RANKS})")
    return dict(sorted(roles.items()))


def world_size(spec) -> int:
    return len(layout(spec))


def data_workers(spec) -> int:
    """n: how many ranks read inputs; the global batch is n × batch_size."""
    return sum(1 for r in layout(spec).values() if r.data_index is not None)


def global_batch(spec) -> int:
    return data_workers(spec) * spec.batch_size


def nodes_represented(spec) -> int:
    """Machines the run stands for (RALP-H: 2·n_w; otherwise one per rank)."""
    if spec.strategy == "ralp" and spec.config["ralp_setting"] == "H":
        return 2 * spec.config["workers"]
    return world_size(spec)


def feature_slices(features: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) of each FC machine's slice of a partitioned layer's ``features`` outputs
    (hybrid): contiguous, balanced (sizes differ by at most one)."""
    if parts > features:
        raise ConfigError(f"hybrid: cannot partition {features} output features over {parts} FC machines "
                          "(replicate that layer or use fewer FC machines)")
    return [(j * features // parts, (j + 1) * features // parts) for j in range(parts)]


def ps_shards(total: int, servers: int) -> list[tuple[int, int]]:
    """[start, stop) of each server's shard of a flattened vector of ``total`` elements: contiguous,
    balanced by element count (sizes differ by at most one)."""
    if servers > total:
        raise ConfigError(f"ps: {servers} servers for {total} parameters — more servers than parameters")
    return [(j * total // servers, (j + 1) * total // servers) for j in range(servers)]
