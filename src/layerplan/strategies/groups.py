"""`groups`: Omnivore's compute groups (Omnivore §IV-A, §V-A).

N conv machines form g groups of k = N/g. Inside a group: synchronous data parallelism on one
group batch (k·B samples, B per machine). Across groups: asynchronous — each group, on its own
clock, pulls the current conv model from the conv model server, runs the conv phase, sends its
activations to the FC side, gets their gradients back, backpropagates and pushes its conv gradient
to the conv model server, which applies it and serves the next pull. Staleness S = g − 1.
The groups start one pull apart (group j's first pull once group j − 1's has arrived), as the
runtime's conv model server starts them: then one group's pull and another's push ride the two
directions of that server's link instead of g pulls, then g pushes, sharing one. That server sends
one group's pull at a time and takes one group's push at a time (each queued until the last has
arrived), as the runtime does: without the queues the schedule let two pulls share the egress and
its round time swung ±15% with a tenth of a millisecond of latency (resnet_cifar, 4 groups, 100 Mbit/s).

On shared cores (the emulated cluster) three or more groups that share no clock draw a run's
spread into their stages' times (``SPREAD``, measured there, where the threads' contention varies
from one pass to the next): their cycle through the conv model server, the FC server and their own
passes is a closed loop that, near balance, loses time to it. And they are simulated with the mean
field (``StepGraph.mean_field_cores``, g ≥ ``MEAN_FIELD_GROUPS``): each compute thread runs at its
mean speed over the threads the drawn schedule has busy beside it (``engine._occupancy_field``),
not in the lineup of the undrawn event-driven schedule, in which they overlapped a third less than
in a run (alexnet_cifar, 4 groups at 1 Gbit/s: 337 ms a round predicted, 408-420 measured). Two
groups keep the event-driven lineup: the conv model server's and the merged FC server's queues hold
them in turn, one computing while the other is served, as the schedule has it.

FC side: with **merged FC** (the default, Omnivore §V-A) one machine holds the FC model and does the
FC compute, one group batch at a time in arrival order (FC staleness 0), and sends a batch's
activation gradients before its SGD step. Without merging, each
group has its own FC compute server, which pulls the FC model from an FC model server and pushes
its FC gradient back.

Placement: the paper puts the conv model server on one of the conv machines; here it is its own
node (the engine's node groups are symmetric, and layerplan's runtime runs it as its own rank), so
a config needs N + 2 nodes with merged FC, N + g + 2 without. The engine unrolls several rounds
and reports the steady state; HE(g) (plan/omnivore.py) is its closed-form check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from layerplan.cost import compute
from layerplan.cost.compute import MemoryUse
from layerplan.cost.engine import Compute, StepGraph, Transfer, iteration_name
from layerplan.errors import ConfigError
from layerplan.hardware import ClusterSpec
from layerplan.netspec.spec import NetSpec
from layerplan.strategies.base import (Strategy, bwd_s, copy_s, fwd_s, param_bytes, require_nodes, require_positive,
                                       stagger_groups, update_s)

ROUNDS = 8  # unrolled rounds (each group one iteration per round); the second half is measured

MEAN_FIELD_GROUPS = 3
"""This many groups or more are simulated with the mean field on shared cores (module docstring).
Four full validations repredicted (vf55, vf57-vf59: 16 two-group configurations each), the mean
field for two groups too put them 0.3-15.3% slow against their scenario's median error (mean of
four runs; +15.3 and +14.0 for alexnet_cifar and vgg16_cifar at 2 workers and 10 Gbit/s), the
event-driven lineup -1.6 to +5.2% (+5.0 and +3.9 there); resnet_cifar's 4 groups at 100 Mbit/s
went -4.7 → -12.5% without it. p90 |error| 7.0/9.2/10.1/8.0% → 6.0/8.9/10.1/7.8%."""


SPREAD = 0.23
"""Coefficient of variation drawn into each compute task's time for MEAN_FIELD_GROUPS groups or
more (``StepGraph.spread``): the runs' own. A traced run of alexnet_cifar, 4 groups of one machine
at 1 Gbit/s: a conv machine's forward pass varied with a coefficient of variation of 0.23, its
backward 0.26, the FC server's group batch 0.19 (0.23 weighted by their times). There the groups'
cycle (pull, forward, the FC server, backward, push) was close to four FC batches, and the FC server
waited for activations 72 ms a round, where the schedule without the spread has it wait 46 ms.

With the calibration made beside a run of it (a 2-core Xeon VM): 480 ms without the spread, 516 with
it (505-516 over seven orders of the draws), 531 measured in the run beside the calibration — the
mean field then taking the other groups busy independently, on the undrawn schedule. Settled again
on the drawn schedule that way (a spread of 0.2) it went only to 490, the conv machines' passes down
from 228 to 208 ms a round — the run's took 237: the draws thin the overlaps that independent
groups would have. Their threads are not independent (``engine._occupancy_field``: the stations
they pass in turn space them), and on the drawn schedule each now meets the threads busy beside it
there. Five full runs on a 2-core Zen 3 VM (vf141-vf145), repredicted: the 4-group rows' median
|error| 7.7 / 7.6 / 8.4 / 8.6 / 5.8% → 9.6 / 7.8 / 7.7 / 6.8 / 3.6%, their runs' p90 23.9 / 13.8 /
17.9 / 12.8 / 16.1% → 22.2 / 13.8 / 17.5 / 12.7 / 15.8% and max 43.5 / 48.2 / 26.3 / 26.4 / 29.5%
→ 36.0 / 42.0 / 26.3 / 21.8 / 29.5%, the medians within 0.1 point. Three validate runs
repredicted (vf130, vf131 and one of that scenario alone), the rows of four groups: alexnet_cifar
4w at 1 Gbit/s −5.4 / −9.5 / −11.4% → +1.0 / −3.9 / −4.8%; vgg16_cifar 4w at 10 Gbit/s −2.0 / −9.2%
→ +0.7 / −3.8%; alexnet_cifar 4w at 10 Gbit/s, where the FC server is busy all the time, +4.5 / +0.1%
→ +8.0 / +0.1%; resnet_cifar's and every 100 Mbit/s row (the conv model server's link busy all the
time) within 0.6 points. Two groups keep every iteration alike: drawn, their rows at 1 Gbit/s moved
5-11 points further off (four full runs repredicted)."""

SPREAD_BATCHES = 192
"""Group batches the spread's last pass simulates (at least ROUNDS rounds): enough that the draws
average out (48 rounds of four groups; with twice as many, six orders of the draws spread as widely)."""

FULLY_ASYNC_MAX_GROUPS = 64
"""space(): g = n is a candidate only up to this many groups (each group is simulated)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupsConfig:
    machines: int
    """N: conv compute machines."""
    groups: int
    """g: compute groups (1 = synchronous, N = fully asynchronous); must divide N."""
    merged_fc: bool = True
    """FC compute and FC model on one machine (Omnivore §V-A)."""
    pipelined: bool = False
    """Two batches in flight per group."""


class Groups(Strategy):
    name = "groups"
    Config = GroupsConfig
    summary = "Omnivore: g asynchronous compute groups of k conv machines, a merged FC server"
    needs_fc_phase = True

    def nodes_needed(self, config: GroupsConfig) -> int:
        return config.machines + 2 + (0 if config.merged_fc else config.groups)

    def check(self, net, cluster, config: GroupsConfig) -> None:
        self.require_applies(net)
        require_positive(self.name, machines=config.machines, groups=config.groups)
        if config.machines % config.groups:
            raise ConfigError(f"groups: {config.groups} groups do not divide {config.machines} conv machines evenly")
        what = f"{config.machines} conv machines + the conv model server + " + (
            "the merged FC server" if config.merged_fc else f"{config.groups} FC compute servers + the FC model server")
        require_nodes(self.name, self.nodes_needed(config), cluster, what)

    def roles(self, config: GroupsConfig) -> dict[str, int]:
        k = config.machines // config.groups
        roles = {f"group{j}": k for j in range(config.groups)}
        roles["conv_model"] = 1
        if config.merged_fc:
            roles["fc"] = 1
        else:
            roles.update({f"fc{j}": 1 for j in range(config.groups)})
            roles["fc_model"] = 1
        return roles

    role_labels = {"conv_model": "the conv model server", "fc": "the merged FC server", "fc_model": "the FC model server"}

    def role_label(self, role: str) -> str:
        if role.startswith("group"):
            return f"a conv machine of {role}"
        if role.startswith("fc") and role[2:].isdigit():
            return f"FC compute server {role}"
        return super().role_label(role)

    def global_batch(self, config, batch):
        return config.machines * batch

    def memory(self, net: NetSpec, cluster: ClusterSpec, config: GroupsConfig, batch: int) -> dict[str, MemoryUse]:
        """A conv machine: the conv phase for its B samples without optimizer state (the conv
        model server updates) and the activation gradients it receives. The conv model server: the
        conv model, summed gradient, momentum and a receive buffer per conv machine (groups push
        asynchronously, all may at once). The merged FC server: the FC phase with momentum for
        one group batch k·B at a time (Omnivore §V-A), with the activations of every group batch
        that may wait for it (N·B, twice with pipelining). Without merging: each FC compute
        server the FC phase without optimizer state for its group's k·B samples; the FC model
        server the FC model, its momentum and a receive buffer per FC compute server."""
        self.check(net, cluster, config)
        g, k = config.groups, config.machines // config.groups
        act = net.boundary_bytes * batch
        p_c, p_f = param_bytes(net.conv_layers), param_bytes(net.fc_layers)
        conv = compute.training_memory(net, net.conv_layers, batch, optimizer_slots=0, buffers_bytes=act)
        out = {f"group{j}": conv for j in range(g)}
        out["conv_model"] = compute.server_memory(p_c, config.machines)
        if config.merged_fc:
            waiting = config.machines * act * (2 if config.pipelined else 1)
            out["fc"] = compute.training_memory(net, net.fc_layers, k * batch, inputs_bytes=waiting)
        else:
            fc = compute.training_memory(net, net.fc_layers, k * batch, optimizer_slots=0, inputs_bytes=k * act)
            out.update({f"fc{j}": fc for j in range(g)})
            out["fc_model"] = compute.server_memory(p_f, g)
        return out

    def default(self, net, cluster, batch, *, machines=None, groups=None, workers=None, **_):
        from layerplan.plan import omnivore

        self.require_applies(net)
        n = machines or workers or cluster.nodes - 2
        if n < 1:
            raise ConfigError(f"groups: {cluster.nodes} nodes leave no conv machine beside the FC and conv model servers")
        g = groups or omnivore.saturating_groups(omnivore.group_times(net, cluster, batch), n, batch)
        return GroupsConfig(machines=n, groups=g)

    def space(self, net, cluster, batch):
        from layerplan.plan import omnivore

        if self.applies(net) or cluster.nodes < 3:
            return []
        n = cluster.nodes - 2
        start = omnivore.saturating_groups(omnivore.group_times(net, cluster, batch), n, batch)
        divs = omnivore.divisors(n)
        i = divs.index(start)
        # Omnivore §4: past the smallest FC-saturating g, more groups add staleness but no throughput,
        # so the search brackets that g; fully asynchronous (g = n) is kept where it is cheap to simulate.
        picks = {1, start, divs[max(0, i - 1)], divs[min(len(divs) - 1, i + 1)]}
        if n <= FULLY_ASYNC_MAX_GROUPS:
            picks.add(n)
        return [GroupsConfig(machines=n, groups=g) for g in sorted(picks)]

    def schedule(self, net: NetSpec, cluster: ClusterSpec, config: GroupsConfig, batch: int) -> StepGraph:
        self.check(net, cluster, config)
        g, k = config.groups, config.machines // config.groups
        act = net.boundary_bytes * batch
        p_c, p_f = param_bytes(net.conv_layers), param_bytes(net.fc_layers)
        # a group's machine copies the pulled conv model into its own before the forward, and gathers
        # its gradient flat after the backward to push it (runtime/roles/groups.py)
        t_cf = fwd_s(net, net.conv_layers, cluster, batch) + copy_s(p_c, cluster)
        t_cb = bwd_s(net, net.conv_layers, cluster, batch) + copy_s(p_c, cluster)
        t_fc = fwd_s(net, net.fc_layers, cluster, k * batch) + bwd_s(net, net.fc_layers, cluster, k * batch)
        lag = 2 if config.pipelined else 1
        # One group alone: the conv model server's k pulls leave its NIC together and, while they are
        # short, TCP does not share it evenly (LinkSpec.flow_lead_bytes): they arrive one after
        # another, as a PS's pulls (strategies/ps.py), and each machine starts its forward pass as its
        # own is in. Simulated as up to STAGGER_GROUPS parts of the group served in turn ("group0",
        # "group0+1", ..., reported as group0; LinkSpec.stagger_shares). With more groups the server
        # sends one group's pull at a time (a queue of whole pulls): not split.
        counts = stagger_groups(k) if g == 1 else [k]
        shares = cluster.nic.stagger_shares(p_c, counts)
        parts = [("" if j == 0 else f"+{j}", w) for j, w in enumerate(shares)] if any(w != 1.0 for w in shares) \
            else [("", 1.0)]  # (role suffix, pull's share)

        def build(i: int):
            tasks = []
            for j in range(g):
                grp = f"group{j}"

                def n(x: str, it: int = i) -> str:
                    return iteration_name(it, f"{x}{j}")

                if i >= lag:
                    prev = (n("update", i - lag),)
                else:  # the staggered start (runtime/roles/groups.py): one group's first pull after another's
                    prev = (iteration_name(i, f"pull{j - 1}"),) if i == 0 and j else ()
                fc_role = "fc" if config.merged_fc else f"fc{j}"
                for p, share in parts:
                    tasks += [
                        # the conv model server sends one group's pull at a time and takes one group's push at a
                        # time, each the next once the last has arrived (runtime/roles/groups.py)
                        Transfer(name=n("pull") + p, src="conv_model", dst=grp + p, bytes_per_flow=p_c, pattern="broadcast",
                                 deps=prev, queue="conv_model pull" if g > 1 else None, share=share),
                        Compute(name=n("conv_fwd") + p, group=grp + p, seconds=t_cf, deps=(n("pull") + p,)),
                        Transfer(name=n("act") + p, src=grp + p, dst=fc_role, bytes_per_flow=act, pattern="spread",
                                 deps=(n("conv_fwd") + p,)),
                    ]
                acts = tuple(n("act") + p for p, _ in parts)
                if config.merged_fc:
                    # Omnivore §V-A: the merged FC server serves whole group batches in arrival order. It
                    # sends a batch's activation gradients, then takes its SGD step (runtime/roles/groups.py)
                    tasks += [Compute(name=n("fc"), group="fc", seconds=t_fc, queue="fc", deps=acts),
                              Compute(name=n("fc_update"), group="fc", seconds=update_s(p_f, cluster), queue="fc",
                                      deps=(n("fc"),))]
                else:
                    fc_prev = (n("fc_push", i - 1),) if i else ()
                    tasks += [
                        Transfer(name=n("fc_pull"), src="fc_model", dst=fc_role, bytes_per_flow=p_f, pattern="broadcast",
                                 deps=fc_prev),
                        Compute(name=n("fc"), group=fc_role, seconds=t_fc, deps=(*acts, n("fc_pull"))),
                        Transfer(name=n("fc_push"), src=fc_role, dst="fc_model", bytes_per_flow=p_f, pattern="spread",
                                 deps=(n("fc"),)),
                        Compute(name=n("fc_update"), group="fc_model", seconds=update_s(p_f, cluster), queue="fc_model",
                                deps=(n("fc_push"),)),
                    ]
                for p, _ in parts:
                    tasks += [
                        Transfer(name=n("grad") + p, src=fc_role, dst=grp + p, bytes_per_flow=act, pattern="broadcast",
                                 deps=(n("fc"),)),
                        Compute(name=n("conv_bwd") + p, group=grp + p, seconds=t_cb, deps=(n("grad") + p,)),
                        Transfer(name=n("push") + p, src=grp + p, dst="conv_model", bytes_per_flow=p_c, pattern="spread",
                                 deps=(n("conv_bwd") + p,), queue="conv_model push" if g > 1 else None),
                    ]
                tasks.append(Compute(name=n("update"), group="conv_model", seconds=update_s(p_c, cluster, gradients_summed=k),
                                     queue="conv_model", deps=tuple(n("push") + p for p, _ in parts)))
            return tasks

        split = len(parts) > 1
        roles = self.roles(config) | ({f"group0{p}": c for (p, _), c in zip(parts, counts)} if split else {})
        out_of_phase = g >= MEAN_FIELD_GROUPS
        drawn = out_of_phase and cluster.shared_cores is not None  # SPREAD was measured on shared cores
        return StepGraph(groups=roles, build=build, iterations=ROUNDS, samples_per_step=g * k * batch,
                         report_as={f"group0{p}": "group0" for p, _ in parts[1:]}, mean_field_cores=out_of_phase,
                         spread=SPREAD if drawn else 0.0,
                         spread_iterations=max(ROUNDS, math.ceil(SPREAD_BATCHES / g)) if drawn else 0)
