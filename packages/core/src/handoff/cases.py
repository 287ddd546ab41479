"""The case model: axes, topologies and their constraints, cases with stable ids, and the
published selections with the coverage each promises.

Case ids are published (CI dashboards key on them): they never change once released.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, fields, replace
from functools import cache
from typing import Protocol

from handoff.covering import stored
from handoff.covering.verify import (
    Implies,
    Model,
    complete,
    format_interaction,
    missing,
    product_rows,
    shortfall,
)
from handoff.errors import HandoffError
from handoff.lifecycle import MOVES, UNHEARD
from handoff.lifecycle import registered as registered_lifecycles

POLICIES = (
    "migration_enabled",
    "migration_disabled",
    "max_seq_len_exceeded",
    "max_seq_len_not_exceeded",
)
#: The faults of the discovery plane, on etcd, with the request in flight on the holder:
#: lease_expiry: SIGKILL of the holder, whose lease must then run out by itself (no entry is
#: removed for it); lease_revoked: the holder's lease revoked; etcd_partition: the holder cut
#: off from etcd (nftables), healed once the frontend no longer lists it; etcd_member_loss:
#: SIGKILL of the member of three that Dynamo's processes hold most connections to;
#: etcd_restart: SIGKILL of etcd, started again on its data within the leases; etcd_loss:
#: SIGKILL of etcd for good.
DISCOVERY = (
    "lease_expiry",
    "lease_revoked",
    "etcd_partition",
    "etcd_member_loss",
    "etcd_restart",
    "etcd_loss",
)
#: worker_failure: SIGKILL. graceful_shutdown: SIGTERM, SIGKILL after the graceful bound.
#: worker_stall: SIGSTOP, SIGCONT once the verdict's evidence is in (a hang, not a crash).
#: stall_past_lease: SIGSTOP, SIGCONT only once the frontend no longer lists the worker (its
#: discovery lease ran out while it was stopped); then it must serve again.
#: drain_expired: SIGTERM to a worker whose own drain timeout is shorter than the request, and
#: no SIGKILL: Dynamo's grace-expiry path. partition: nftables drop every packet of the
#: worker's connections (request plane, response streams, NATS), removed once the evidence is in.
#: broker_stall, broker_loss: SIGSTOP or SIGKILL of the deployment's nats-server mid-request,
#: resumed or restarted on its port once the response is in.
#: engine_failure: SIGKILL of the engine's core process alone (vLLM's `VLLM::EngineCore`, a
#: child of the worker), the worker process that registered with the frontend left running.
#: client_close, close_after_move, close_in_stall: the client leaves (`ABANDONS`).
#: lease_expiry ... etcd_loss: the discovery plane's faults, on etcd (`DISCOVERY`).
FAULTS = (
    "worker_failure",
    "graceful_shutdown",
    "worker_stall",
    "drain_expired",
    "partition",
    "broker_stall",
    "broker_loss",
    "stall_past_lease",
    "engine_failure",
    *DISCOVERY,
    "client_close",
    "close_after_move",
    "close_in_stall",
)
KILLS = ("worker_failure", "graceful_shutdown")
#: A client that closes its stream, and the worker fault that comes first: none (it leaves
#: mid-stream), a SIGKILL (it leaves once the successor streams), a SIGSTOP (it leaves while
#: the holder is stopped, before the frontend's stream timeout would move the request).
ABANDONS = {
    "client_close": None,
    "close_after_move": "worker_failure",
    "close_in_stall": "worker_stall",
}
#: What befalls a worker or the broker while its client waits: every fault but a client's and
#: the discovery plane's.
WORKER_FAULTS = tuple(f for f in FAULTS if f not in ABANDONS and f not in DISCOVERY)
#: The faults of an engine that runs apart from its worker process (`Backend.engine_core`).
ENGINE = ("engine_failure",)
#: The stall that lasts until the frontend no longer lists the stopped worker.
PAST_LEASE = "stall_past_lease"
#: The faults that SIGSTOP the worker's tree.
STALLS = ("worker_stall", PAST_LEASE)
#: The faults that leave the worker alive but silent to the frontend, until they are healed.
SILENT = (*STALLS, "partition")
#: The faults that SIGTERM the worker and let it drain: the request runs on meanwhile.
DRAINS = ("graceful_shutdown", "drain_expired")
#: The faults of the NATS broker, not of a worker.
BROKER = ("broker_stall", "broker_loss")
#: What no topology allows, each with why.
CONSTRAINTS = (
    *(
        Implies(
            "fault",
            fault,
            "plane",
            ("nats",),
            "the broker's faults need the NATS plane: on the TCP plane NATS carries no request",
        )
        for fault in BROKER
    ),
    Implies(
        "fault",
        PAST_LEASE,
        "policy",
        ("migration_enabled",),
        "what a lapsed lease does to the resumed worker does not depend on the policy; the "
        "policies of a stall are qualified by worker_stall",
    ),
)
APIS = ("chat", "completion")
RESPONSES = ("stream", "unary")
PLANES = ("nats", "tcp")
#: The requests the frontend must not move (`Topology.request`): a guided one (structured
#: output), and one of two choices (`n` = 2).
MAY_NOT_MOVE = ("guided", "choices")

#: The five axes of a case, in id order; the topology names the selection a case is in.
AXES: dict[str, tuple[str, ...]] = {
    "policy": POLICIES,
    "fault": FAULTS,
    "api": APIS,
    "response": RESPONSES,
    "plane": PLANES,
}

#: pre_merge: the published rows (every pair, or the topology's promise); nightly: a generated
#: array of every triple, seeded with the pre-merge rows; full: the whole product.
SELECTIONS = ("pre_merge", "nightly", "full")


@dataclass(frozen=True)
class Restriction:
    """A topology allows only `allowed` values of `axis`, because `why`. A backend's
    restriction holds in the topologies it names (`only_in`), or in every one it runs."""

    axis: str
    allowed: tuple[str, ...]
    why: str
    only_in: tuple[str, ...] = ()

    def holds_in(self, topology_name: str) -> bool:
        return not self.only_in or topology_name in self.only_in


@dataclass(frozen=True)
class Promise:
    """The coverage a selection promises: every allowed pair of values among the axes in
    `pairs_over`, every allowed value of each axis in `each_value_of`, and each of the named
    values of an axis in `values_of` that is allowed."""

    pairs_over: tuple[str, ...] = ()
    each_value_of: tuple[str, ...] = ()
    triples_over: tuple[str, ...] = ()
    values_of: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def cells(self) -> tuple[tuple[str, str], ...]:
        """`values_of` as (axis, value) cells."""
        return tuple((axis, v) for axis, values in self.values_of for v in values)

    def describe(self) -> str:
        parts = []
        if self.triples_over:
            parts.append("every triple over " + ", ".join(self.triples_over))
        if self.pairs_over:
            parts.append("every pair over " + ", ".join(self.pairs_over))
        if self.each_value_of:
            parts.append("every value of " + ", ".join(self.each_value_of))
        for axis, values in self.values_of:
            parts.append(f"each {axis} of " + ", ".join(values))
        return "; ".join(parts) or "nothing: its cases run nightly"


@dataclass(frozen=True)
class Topology:
    """Which worker the fault hits, when, and which rows this topology allows."""

    name: str
    #: The role of the worker the fault hits.
    target_role: str
    #: "decoding": after tokens have streamed; "prefill": before the first token.
    fault_window: str
    restrictions: tuple[Restriction, ...]
    #: Axes fixed by a restriction that the published ids leave out.
    omitted_from_id: tuple[str, ...]
    pre_merge_ids: tuple[str, ...]
    pre_merge_promise: Promise
    #: The verdict must also prove that the request's KV prefix was transferred.
    proves_kv_transfer: bool = False
    #: Its workers register on etcd whatever discovery the run chose (`lifecycle.layout`): the
    #: discovery plane's topology.
    on_etcd: bool = False
    #: How the case exercises its fault (`responses.exercise.WORKLOADS`): "one" request;
    #: "load": many at once (the backend's `load_requests`), the fault on the worker that
    #: holds the most of them; "rolling": a steady load while every worker of the target role
    #: is drained in turn; "leaves": a client that leaves.
    workload: str = "one"
    #: What the request asks for besides its text: "plain" (nothing), one of `MAY_NOT_MOVE`,
    #: "usage" (a plain request whose usage after the move is judged too), or "stop" and
    #: "stop_after" (one with a stop string across or after the move: `responses.stops`), or
    #: "min_tokens" (stop strings after it, the first inside `min_tokens`), or one of
    #: `SAMPLINGS` (its tokens chosen under penalties or drawn).
    request: str = "plain"
    #: The silent worker's race, on purpose (`policies.KNOWN_RACES`): the lifecycle repeats
    #: until it shows (`responses.exercise.exercise`); a stalled worker runs again the
    #: instant the frontend counts the move, a cut-off one stays cut off until the response
    #: has ended (`responses.recovery.Heal`). Elsewhere a silent worker waits for the
    #: successor's first token, and a cut decode worker is cut in its response's last seconds.
    race: bool = False
    #: A load case whose faulted worker's replacement starts as the fault lands and must join
    #: while the streams are in flight (`responses.joining`).
    join: bool = False

    @property
    def load(self) -> bool:
        """Many requests in flight at once."""
        return self.workload in ("load", "rolling")

    @property
    def id_axes(self) -> tuple[str, ...]:
        return tuple(a for a in AXES if a not in self.omitted_from_id)

    def allowed(self) -> dict[str, tuple[str, ...]]:
        """Each axis with the values this topology allows: those every restriction allows."""
        values = dict(AXES)
        for r in self.restrictions:
            values[r.axis] = tuple(v for v in values[r.axis] if v in r.allowed)
        return values

    def restriction_on(self, axis: str, value: str) -> Restriction | None:
        """The restriction that forbids `value` of `axis` here, if any."""
        return next(
            (r for r in self.restrictions if r.axis == axis and value not in r.allowed), None
        )


#: What every topology but `abandoned` says of the client's faults.
CLIENT_STAYS = Restriction(
    "fault",
    WORKER_FAULTS,
    "a client that leaves is qualified by the abandoned cases",
)

#: What every topology but `engine_core` says of the engine's own faults.
ENGINE_LIVES = Restriction(
    "fault",
    tuple(f for f in FAULTS if f not in ENGINE),
    "an engine core that dies under its live worker is qualified by the engine_core cases",
)

#: What a pre-merge selection of a few rows promises where the rows cannot cover every policy
#: in pairs: every pair over fault, api and plane, and every policy once.
FEW_ROWS_PROMISE = Promise(pairs_over=("fault", "api", "plane"), each_value_of=("policy",))

#: What a pre-merge selection of four rows under load promises: each lifecycle of a worker
#: fault once (a kill, a drain, a stall, a cut), every policy, and every pair of api and plane.
#: Four rows hold no more: the broker's faults and the expired drain under load are nightly.
LIFECYCLES_PROMISE = Promise(
    pairs_over=("api", "plane"),
    each_value_of=("policy",),
    values_of=(("fault", ("worker_failure", "graceful_shutdown", "worker_stall", "partition")),),
)

#: What the load topologies, of whichever role, do not allow.
LOAD_RESTRICTIONS = (
    CLIENT_STAYS,
    ENGINE_LIVES,
    Restriction(
        "response",
        ("stream",),
        "a load case sends streams and unary requests together, one of each in turn: the id "
        "leaves the response out",
    ),
    Restriction(
        "fault",
        tuple(f for f in FAULTS if f != PAST_LEASE),
        "a discovery lease is a worker's however many requests it holds: the aggregate cases "
        "qualify what its lapse does",
    ),
)

#: Many requests at once on aggregate workers; `decode_load` is the same on decode workers.
LOAD = Topology(
    name="load",
    target_role="aggregate",
    fault_window="decoding",
    restrictions=LOAD_RESTRICTIONS,
    omitted_from_id=("response",),
    pre_merge_ids=(
        "migration_disabled-worker_failure-completion-tcp",
        "migration_enabled-worker_stall-chat-nats",
        "max_seq_len_exceeded-graceful_shutdown-chat-tcp",
        "max_seq_len_not_exceeded-partition-completion-nats",
    ),
    pre_merge_promise=LIFECYCLES_PROMISE,
    workload="load",
)

#: A load case whose faulted worker is replaced while the streams are in flight: killed or
#: drained, its replacement started as the fault lands (Dynamo issues 13088 and 14716).
JOIN = replace(
    LOAD,
    name="join",
    restrictions=(
        *LOAD_RESTRICTIONS,
        Restriction(
            "fault",
            KILLS,
            "a worker that leaves for good is the one replaced: a stalled or cut-off worker "
            "comes back by itself, as the load cases qualify",
        ),
    ),
    pre_merge_ids=(
        "migration_enabled-worker_failure-chat-nats",
        "migration_enabled-graceful_shutdown-completion-tcp",
    ),
    pre_merge_promise=Promise(
        values_of=(("policy", ("migration_enabled",)),), each_value_of=("fault", "api", "plane")
    ),
    join=True,
)

#: A rolling restart under a steady load: each worker of the target role drained in turn while
#: its replacement starts, the next one once the replacement is listed (Dynamo issue 13088).
ROLLING = replace(
    LOAD,
    name="rolling",
    restrictions=(
        *LOAD_RESTRICTIONS,
        Restriction(
            "fault",
            ("graceful_shutdown",),
            "a rolling restart drains each worker in turn, as an orchestrator does: the id "
            "leaves the fault out",
        ),
        Restriction(
            "policy",
            ("migration_enabled",),
            "a rolling restart loses nothing only where requests move; what each policy does to "
            "a drained worker's requests is qualified by the load and join cases: the id leaves "
            "the policy out",
        ),
    ),
    omitted_from_id=("policy", "fault", "response"),
    pre_merge_ids=("chat-nats", "completion-tcp"),
    pre_merge_promise=Promise(each_value_of=("api", "plane")),
    workload="rolling",
)

#: A request the frontend must not move (`MAY_NOT_MOVE`), faulted while it decodes: a guide
#: here, two choices in `choices`.
GUIDED = Topology(
    name="guided",
    target_role="aggregate",
    fault_window="decoding",
    restrictions=(
        Restriction(
            "fault",
            KILLS,
            "the frontend refuses the move before the first attempt, whatever ends that attempt: "
            "a kill and a drain show the refusal; a silent worker's request that may not move "
            "ends as the migration_disabled cases qualify",
        ),
    ),
    omitted_from_id=(),
    pre_merge_ids=("migration_enabled-worker_failure-chat-stream-nats",),
    # The one row where the frontend would move any other request.
    pre_merge_promise=Promise(values_of=(("policy", ("migration_enabled",)),)),
    request="guided",
)

#: What the user is told of its request after a move (`usage`): `usage.prompt_tokens` the
#: prompt it sent, as an undisturbed request's, not the context the frontend re-issued
#: (`evidence.usage_problems`). Nightly only: Dynamo 1.6.1 reports the re-issued context, a
#: failure no merge of a deployment can change (docs/known-issues.md).
USAGE = Topology(
    name="usage",
    target_role="aggregate",
    fault_window="decoding",
    restrictions=(
        Restriction(
            "policy",
            ("migration_enabled",),
            "what a moved request is told needs a move: the other policies' responses are "
            "qualified by the aggregate cases",
        ),
        Restriction(
            "fault",
            KILLS,
            "any fault that moves the request re-issues its context the same way: a kill and "
            "a drain move it soonest",
        ),
    ),
    omitted_from_id=("policy",),
    pre_merge_ids=(),
    pre_merge_promise=Promise(),
    request="usage",
)

#: A request that must end at a stop string whose match spans the move (`responses.stops`):
#: the user gets the text before the string, finish "stop", the tokens to its end counted.
#: One row pre-merge (a vLLM CPU case takes about 17 s): Dynamo 1.6.1's frontend keeps the match
#: across a move (measured: docs/cases.md as of 708d296), and a release that loses it fails there.
STOP = replace(
    USAGE,
    name="stop",
    restrictions=(
        Restriction(
            "policy",
            ("migration_enabled",),
            "a stop string across a move needs a move: the other policies' responses are "
            "qualified by the aggregate cases",
        ),
        Restriction(
            "fault", KILLS, "a kill and a drain move the request soonest, inside the string"
        ),
    ),
    pre_merge_ids=("worker_failure-chat-stream-nats",),
    pre_merge_promise=Promise(values_of=(("fault", ("worker_failure",)),)),
    request="stop",
)

#: The same request with its stop string wholly after the move, from the output's middle: the
#: new worker's tokens before it reach the user and are compared too. Nightly only.
STOP_AFTER = replace(
    STOP,
    name="stop_after",
    pre_merge_ids=(),
    pre_merge_promise=Promise(),
    request="stop_after",
)
#: The same with `min_tokens` across the move: a first stop string after the move ends before
#: `min_tokens`, so the response must pass it and end at a second one just after. Dynamo
#: matches stop strings in its frontend, above the move: a `min_tokens` lost there ends the
#: response at the first, one counted from the new worker's start passes the second too. The
#: engine's own rebased `min_tokens` (Dynamo PR 13600) bears on EOS alone, which handoff's model
#: never draws: not judged. Nightly only.
MIN_TOKENS = replace(STOP_AFTER, name="min_tokens", request="min_tokens")
#: The topologies whose request carries a stop string (`responses.stops`).
STOPS = (STOP.name, STOP_AFTER.name, MIN_TOKENS.name)
#: Requests whose tokens are chosen otherwise than the model's best (`client.Sampling`, the
#: values in `responses.single.SAMPLED`): a penalty on the words already generated (frequency,
#: presence), on those of the prompt too (repetition), or a seeded draw at a temperature. Killed
#: or drained as in `stop_after`, the user's text must be what the same request gives
#: undisturbed, as the backend computes it from its model's own definition. Dynamo's migration
#: document (PR 13600) says a move cannot carry penalties on generated tokens
#: (`policies.KNOWN_DIVERGENCES`). Nightly only.
SAMPLINGS = ("frequency_penalty", "presence_penalty", "repetition_penalty", "seeded")
SAMPLED_TOPOLOGIES = tuple(replace(STOP_AFTER, name=n, request=n) for n in SAMPLINGS)

#: A client that leaves (`ABANDONS`): every worker that held its request must stop it.
ABANDONED = Topology(
    name="abandoned",
    target_role="aggregate",
    fault_window="decoding",
    restrictions=(
        Restriction(
            "fault",
            tuple(ABANDONS),
            "these cases qualify a client that leaves; the other topologies qualify the faults "
            "of workers and of the broker",
        ),
        Restriction(
            "policy",
            ("migration_enabled",),
            "a client that leaves ends its request whatever the policy, and a close after a "
            "move needs a policy that moves it: the id leaves the policy out",
        ),
        Restriction(
            "response",
            ("stream",),
            "the client closes a stream after tokens it saw; a unary client that hangs up is "
            "not qualified yet: the id leaves the response out",
        ),
    ),
    omitted_from_id=("policy", "response"),
    pre_merge_ids=(
        "client_close-chat-nats",
        "close_after_move-completion-tcp",
        "close_in_stall-chat-tcp",
    ),
    pre_merge_promise=Promise(each_value_of=("fault",)),
    workload="leaves",
)

#: Dynamo 1.6.1's race of the re-issued request, on purpose: the request re-issued to the prefill
#: worker makes no progress while its silent decode worker runs the one it lost: a stalled worker
#: resumed the instant the frontend counts the move, which misses the cancellation, or a cut-off
#: one, which decodes it to its end (docs/known-issues.md).
DECODE_RACE = Topology(
    name="decode_race",
    target_role="decode",
    fault_window="decoding",
    restrictions=(
        Restriction(
            "fault",
            ("worker_stall", "partition"),
            "the race is a silent worker's that runs the request it lost while the move is "
            "re-issued",
        ),
        Restriction(
            "policy",
            ("migration_enabled",),
            "the race is in the move itself; the policies are qualified by the decode cases",
        ),
        Restriction("response", ("stream",), "the race cuts a stream short: a stream shows it"),
    ),
    omitted_from_id=("policy", "response"),
    # The cut-off worker's race is nightly: after other cases on its pool it once showed
    # otherwise (docs/known-issues.md).
    pre_merge_ids=("worker_stall-chat-tcp",),
    pre_merge_promise=Promise(values_of=(("fault", ("worker_stall",)),)),
    race=True,
)

#: An engine core killed under its live worker (`ENGINE`), while it decodes.
ENGINE_CORE = Topology(
    name="engine_core",
    target_role="aggregate",
    fault_window="decoding",
    restrictions=(
        Restriction(
            "fault",
            ENGINE,
            "these cases qualify an engine core that dies under its live worker; the other "
            "topologies qualify the faults of the worker process itself",
        ),
    ),
    omitted_from_id=("fault",),
    pre_merge_ids=(
        "migration_enabled-chat-stream-nats",
        "migration_disabled-completion-unary-tcp",
        "max_seq_len_exceeded-chat-stream-tcp",
        "max_seq_len_not_exceeded-completion-unary-nats",
    ),
    pre_merge_promise=Promise(pairs_over=("api", "plane"), each_value_of=("policy", "response")),
)

#: The discovery plane's faults (`DISCOVERY`) and a stall past the lease, on etcd whatever
#: discovery the run chose (`lifecycle.layout`, `Topology.on_etcd`).
DISCOVERY_PLANE = Topology(
    name="discovery",
    target_role="aggregate",
    fault_window="decoding",
    on_etcd=True,
    restrictions=(
        Restriction(
            "fault",
            (*DISCOVERY, PAST_LEASE),
            "these cases qualify the discovery plane on etcd; the other topologies qualify "
            "the faults of workers, engines, clients and the broker",
        ),
        Restriction(
            "policy",
            ("migration_enabled",),
            "what the discovery plane does to a request does not depend on the policy, and a "
            "kill's policies are qualified by worker_failure: the id leaves the policy out",
        ),
    ),
    omitted_from_id=("policy",),
    pre_merge_ids=(
        "lease_expiry-chat-stream-tcp",
        "lease_revoked-completion-stream-nats",
        "etcd_partition-chat-unary-tcp",
        "etcd_member_loss-completion-unary-tcp",
        "etcd_loss-completion-stream-tcp",
        "stall_past_lease-chat-stream-tcp",
    ),
    # The restart's race is nightly: its trials run until the race shows, past the floor of
    # the main job in about one run of six (docs/cases.md as of 708d296).
    pre_merge_promise=Promise(
        each_value_of=("api", "response", "plane"),
        values_of=(("fault", tuple(f for f in (*DISCOVERY, PAST_LEASE) if f != "etcd_restart")),),
    ),
)

TOPOLOGIES: dict[str, Topology] = {
    t.name: t
    for t in (
        Topology(
            name="aggregate",
            target_role="aggregate",
            fault_window="decoding",
            restrictions=(CLIENT_STAYS, ENGINE_LIVES),
            omitted_from_id=(),
            pre_merge_ids=(
                "migration_enabled-worker_failure-chat-stream-nats",
                "migration_enabled-graceful_shutdown-completion-unary-tcp",
                "migration_disabled-worker_failure-chat-unary-tcp",
                "migration_disabled-graceful_shutdown-completion-stream-nats",
                "max_seq_len_exceeded-worker_failure-completion-stream-tcp",
                "max_seq_len_exceeded-graceful_shutdown-chat-unary-nats",
                "max_seq_len_not_exceeded-worker_failure-completion-unary-nats",
                "max_seq_len_not_exceeded-graceful_shutdown-chat-stream-tcp",
                # The stall's pairs, added by the covering generator (`complete`).
                "migration_enabled-worker_stall-chat-stream-nats",
                "migration_disabled-worker_stall-completion-unary-tcp",
                "max_seq_len_exceeded-worker_stall-chat-stream-nats",
                "max_seq_len_not_exceeded-worker_stall-chat-stream-nats",
                # The expired drain's pairs, the same way.
                "migration_enabled-drain_expired-chat-stream-nats",
                "migration_disabled-drain_expired-completion-unary-tcp",
                "max_seq_len_exceeded-drain_expired-chat-stream-nats",
                "max_seq_len_not_exceeded-drain_expired-chat-stream-nats",
                # The partition's pairs, the same way.
                "migration_enabled-partition-chat-stream-nats",
                "migration_disabled-partition-completion-unary-tcp",
                "max_seq_len_exceeded-partition-chat-stream-nats",
                "max_seq_len_not_exceeded-partition-chat-stream-nats",
                # The broker's pairs, the same way (on the NATS plane only: `CONSTRAINTS`).
                "migration_enabled-broker_stall-chat-stream-nats",
                "migration_enabled-broker_loss-chat-stream-nats",
                "migration_disabled-broker_stall-completion-unary-nats",
                "migration_disabled-broker_loss-completion-unary-nats",
                "max_seq_len_exceeded-broker_stall-chat-stream-nats",
                "max_seq_len_exceeded-broker_loss-chat-stream-nats",
                "max_seq_len_not_exceeded-broker_stall-chat-stream-nats",
                "max_seq_len_not_exceeded-broker_loss-chat-stream-nats",
                # The stall past the lease's pairs (with migration_enabled only: `CONSTRAINTS`).
                "migration_enabled-stall_past_lease-chat-stream-nats",
                "migration_enabled-stall_past_lease-completion-unary-tcp",
            ),
            pre_merge_promise=Promise(pairs_over=tuple(AXES)),
        ),
        Topology(
            name="decode",
            target_role="decode",
            fault_window="decoding",
            restrictions=(
                CLIENT_STAYS,
                ENGINE_LIVES,
                Restriction(
                    "response",
                    ("stream",),
                    "a unary response leaves nothing in flight to fault once it is complete; "
                    "the decode fault is proven by streamed chunks",
                ),
                Restriction(
                    "fault",
                    tuple(f for f in FAULTS if f != PAST_LEASE),
                    "a discovery lease is a worker's whatever its role: the aggregate cases "
                    "qualify what its lapse does",
                ),
            ),
            omitted_from_id=(),
            pre_merge_ids=(
                "migration_enabled-worker_failure-chat-stream-nats",
                "migration_disabled-graceful_shutdown-completion-stream-nats",
                "max_seq_len_exceeded-worker_failure-completion-stream-tcp",
                "max_seq_len_not_exceeded-graceful_shutdown-chat-stream-tcp",
                "migration_enabled-worker_stall-chat-stream-nats",
                "migration_enabled-worker_stall-completion-stream-tcp",
                "migration_enabled-drain_expired-chat-stream-nats",
                "migration_enabled-drain_expired-completion-stream-tcp",
                "migration_enabled-partition-chat-stream-nats",
                "migration_enabled-partition-completion-stream-tcp",
                "migration_enabled-broker_stall-chat-stream-nats",
                "migration_enabled-broker_loss-chat-stream-nats",
                "migration_enabled-broker_stall-completion-stream-nats",
                "migration_enabled-broker_loss-completion-stream-nats",
            ),
            # Four rows cannot cover 4 policies x 2 values in pairs; the aggregate rows do.
            pre_merge_promise=FEW_ROWS_PROMISE,
        ),
        Topology(
            name="kv_transfer",
            target_role="decode",
            fault_window="decoding",
            restrictions=(
                Restriction(
                    "policy",
                    ("migration_enabled",),
                    "these cases qualify migrating a request whose KV prefix was transferred; "
                    "the policies are qualified by the aggregate and decode cases",
                ),
                Restriction(
                    "fault",
                    KILLS,
                    "these cases qualify migrating a transferred prefix; a stalled, cut-off or "
                    "expired decode worker is qualified by the decode cases",
                ),
            ),
            omitted_from_id=("policy",),
            pre_merge_ids=(
                "worker_failure-chat-stream-nats",
                "graceful_shutdown-chat-unary-tcp",
            ),
            pre_merge_promise=Promise(each_value_of=("fault", "response", "plane")),
            proves_kv_transfer=True,
        ),
        Topology(
            name="prefill",
            target_role="prefill",
            fault_window="prefill",
            restrictions=(
                Restriction(
                    "fault",
                    KILLS,
                    "what the frontend does with a prefill worker stalled, cut off, or whose "
                    "drain expires, before the first token is not yet measured on Dynamo 1.6.1",
                ),
            ),
            omitted_from_id=(),
            pre_merge_ids=(
                "migration_enabled-worker_failure-chat-stream-nats",
                "migration_disabled-graceful_shutdown-completion-unary-nats",
                "max_seq_len_exceeded-worker_failure-completion-unary-tcp",
                "max_seq_len_not_exceeded-graceful_shutdown-chat-stream-tcp",
            ),
            pre_merge_promise=Promise(
                pairs_over=("fault", "api", "plane"), each_value_of=("policy", "response")
            ),
        ),
        GUIDED,
        # Nightly only: the frontend refuses to move it by the same rule as a guided request.
        replace(
            GUIDED, name="choices", request="choices", pre_merge_ids=(), pre_merge_promise=Promise()
        ),
        USAGE,
        STOP,
        STOP_AFTER,
        MIN_TOKENS,
        *SAMPLED_TOPOLOGIES,
        ABANDONED,
        LOAD,
        # Nightly only: a backend runs four load cases pre-merge, the aggregate's.
        replace(
            LOAD,
            name="decode_load",
            target_role="decode",
            pre_merge_ids=(),
            pre_merge_promise=Promise(),
        ),
        JOIN,
        ROLLING,
        DECODE_RACE,
        ENGINE_CORE,
        DISCOVERY_PLANE,
    )
}


def topology(name: str) -> Topology:
    try:
        return TOPOLOGIES[name]
    except KeyError:
        raise HandoffError(
            f"unknown topology {name!r}: use one of {', '.join(TOPOLOGIES)}"
        ) from None


@dataclass(frozen=True)
class Case:
    """One value per axis, in one topology. `id` joins the topology's id axes with '-'."""

    policy: str
    fault: str
    api: str
    response: str
    plane: str
    topology: str = "aggregate"

    def __post_init__(self) -> None:
        where = topology(self.topology)
        for f in fields(self):
            if f.name == "topology":
                continue
            value = getattr(self, f.name)
            if value not in AXES[f.name] and not (f.name == "fault" and plugin_fault(value)):
                raise HandoffError(
                    f"unknown {f.name} {value!r}: use one of {', '.join(AXES[f.name])}"
                )
            if rule := where.restriction_on(f.name, standing_for(f.name, value)):
                raise HandoffError(
                    f"{self.topology} cases allow {f.name} {', '.join(rule.allowed)} only, "
                    f"not {value!r}: {rule.why}"
                )
        if rule := broken_constraint(self.row()):
            where_id = f"{self.topology} case {self.id!r}"
            raise HandoffError(f"no {where_id}: {rule.describe()}: {rule.why}")

    @property
    def id(self) -> str:
        return "-".join(getattr(self, axis) for axis in topology(self.topology).id_axes)

    @property
    def key(self) -> str:
        """Unique across topologies: `<topology>/<id>`; the pytest item id and log folder."""
        return f"{self.topology}/{self.id}"

    @classmethod
    def from_id(cls, case_id: str, topology_name: str = "aggregate") -> Case:
        where = topology(topology_name)
        values = case_id.split("-")
        if len(values) != len(where.id_axes):
            example = "-".join(where.allowed()[a][0] for a in where.id_axes)
            raise HandoffError(
                f"malformed {topology_name} case id {case_id!r}: expected "
                f"{'-'.join(where.id_axes)}, e.g. {example}"
            )
        row = {a: where.allowed()[a][0] for a in where.omitted_from_id}
        row.update(zip(where.id_axes, values, strict=True))
        return cls(**row, topology=topology_name)

    def row(self) -> dict[str, str]:
        return {axis: getattr(self, axis) for axis in AXES}


#: What a plugin's own lifecycle runs as where a topology restricts faults, by how it meets the
#: response (`Lifecycle.meets`): a kill's, or a stall's. It strikes a worker; one off the
#: response's path, or a client's, is not qualified by a plugin yet.
PLUGIN_FAULTS_RUN_AS = {MOVES: "worker_failure", UNHEARD: "worker_stall"}


def plugin_fault(name: str) -> bool:
    """Whether `name` is a fault lifecycle a plugin registered (`handoff.lifecycle`), beyond
    handoff's own (`FAULTS`)."""
    return name not in FAULTS and name in registered_lifecycles()


def standing_for(axis: str, value: str) -> str:
    """The value a topology's restrictions judge: a plugin's fault as the kill or the stall it
    runs as (`PLUGIN_FAULTS_RUN_AS`)."""
    if axis != "fault" or value in FAULTS:
        return value
    meets = registered_lifecycles()[value].meets
    if meets not in PLUGIN_FAULTS_RUN_AS:
        raise HandoffError(
            f"fault lifecycle {value!r} meets the response as {meets!r}: a plugin's lifecycle "
            f"may strike a worker only ({' or '.join(PLUGIN_FAULTS_RUN_AS)})"
        )
    return PLUGIN_FAULTS_RUN_AS[meets]


class Runner(Protocol):
    """What a selection needs to know of a backend (handoff.backend.Backend is one): its
    name, the topologies and values it runs, the fault lifecycles of its own it adds (each
    registered by a plugin), and its roles. A protocol, so that the case model imports nothing
    of the backends that use it."""

    name: str
    topologies: Collection[str]
    restrictions: Sequence[Restriction]
    lifecycles: Collection[str]

    def roles(self, topology_name: str) -> tuple[str, ...]: ...


def allowed(topology_name: str, backend: Runner | None = None) -> dict[str, tuple[str, ...]]:
    """Each axis with the values the topology allows and, if given, the backend runs."""
    values = topology(topology_name).allowed()
    if backend is not None:
        values["fault"] += own_faults(backend, values["fault"])
    for r in backend_restrictions(backend, topology_name) if backend else ():
        values[r.axis] = tuple(v for v in values[r.axis] if v in r.allowed)
    return values


def own_faults(backend: Runner, faults: tuple[str, ...]) -> tuple[str, ...]:
    """The backend's own lifecycles that run where `faults` do: each where what it runs as
    does. One no installed plugin registers is an error that says the fix."""
    if absent := [f for f in backend.lifecycles if not plugin_fault(f)]:
        raise HandoffError(
            f"backend {backend.name!r} runs fault lifecycle(s) {', '.join(absent)}, which no "
            f"installed plugin registers (handoff.lifecycles): install the plugin that provides "
            f"them"
        )
    return tuple(f for f in backend.lifecycles if standing_for("fault", f) in faults)


def broken_constraint(row: dict[str, str]) -> Implies | None:
    """The constraint (`CONSTRAINTS`) that `row` breaks, if any."""
    return next(
        (c for c in CONSTRAINTS if row[c.axis] == c.value and row[c.then_axis] not in c.then),
        None,
    )


def allowed_rows(values: dict[str, tuple[str, ...]]) -> list[dict[str, str]]:
    """The product of `values` less the rows a constraint forbids."""
    return [row for row in product_rows(values) if broken_constraint(row) is None]


def model(values: dict[str, tuple[str, ...]], seeds: tuple[dict[str, str], ...] = ()) -> Model:
    """The covering model of `values`, with the constraints on the values it has."""
    rules = tuple(c for c in CONSTRAINTS if c.value in values[c.axis])
    return Model(values, rules, seeds)


def backend_restrictions(backend: Runner, topology_name: str) -> list[Restriction]:
    """The restrictions of `backend` that hold in the topology."""
    return [r for r in backend.restrictions if r.holds_in(topology_name)]


def backend_restriction(backend: Runner, case: Case) -> Restriction | None:
    """The backend restriction that rules `case` out, if any."""
    return next(
        (
            r
            for r in backend_restrictions(backend, case.topology)
            if getattr(case, r.axis) not in r.allowed
        ),
        None,
    )


def selection(topology_name: str, name: str, backend: Runner | None = None) -> tuple[Case, ...]:
    """The cases of one topology and selection, published rows first.

    With a backend that cannot run some values (its `restrictions`), those rows are left out;
    a pre_merge selection then gets the fewest extra rows that keep its promise over the values
    the backend runs, and the kept rows keep their published ids. A nightly selection is a
    generated strength-3 covering array seeded with the pre-merge rows the backend runs.
    """
    where = topology(topology_name)
    values = allowed(topology_name, backend)
    if name not in SELECTIONS:
        raise HandoffError(f"unknown selection {name!r}: use one of {', '.join(SELECTIONS)}")
    if name == "full":
        return tuple(Case(**row, topology=topology_name) for row in allowed_rows(values))
    published = [Case.from_id(i, topology_name) for i in where.pre_merge_ids]
    kept = [c for c in published if backend is None or backend_restriction(backend, c) is None]
    if name == "nightly":
        seeds = tuple(tuple(c.row().items()) for c in kept)
        rows = _nightly_rows(tuple((a, tuple(v)) for a, v in values.items()), seeds)
        return tuple(Case(**dict(row), topology=topology_name) for row in rows)
    if len(kept) == len(published) and not any(map(plugin_fault, values["fault"])):
        return tuple(published)
    rows = complete(
        [c.row() for c in kept],
        allowed_rows(values),
        where.pre_merge_promise.pairs_over,
        where.pre_merge_promise.each_value_of,
        where.pre_merge_promise.cells,
    )
    return tuple(kept) + tuple(Case(**row, topology=topology_name) for row in rows)


@cache
def _nightly_rows(
    values: tuple[tuple[str, tuple[str, ...]], ...], seeds: tuple[tuple[tuple[str, str], ...], ...]
) -> tuple[tuple[tuple[str, str], ...], ...]:
    """Generated once (`handoff.covering.stored`): collection and `handoff cases` ask for it
    repeatedly, in every process. Every triple; every pair where two axes alone vary."""
    seeded = model(dict(values), tuple(dict(s) for s in seeds))
    strength = min(3, sum(len(v) > 1 for _, v in values))
    return tuple(tuple(row.items()) for row in stored.generate(seeded, strength=strength))


def promise(topology_name: str, name: str) -> Promise:
    """What the selection promises. A nightly promises every triple over the axes the
    topology's ids name (every pair where they are two): an axis it fixes to one value
    (kv_transfer's policy) has nothing to cover."""
    where = topology(topology_name)
    if name == "pre_merge":
        return where.pre_merge_promise
    if len(where.id_axes) < 3:  # `rolling`: its two axes in pairs, the whole product
        return Promise(pairs_over=where.id_axes, each_value_of=where.id_axes)
    return Promise(triples_over=where.id_axes, each_value_of=where.id_axes)


def unmet(
    topology_name: str,
    cases: Sequence[Case],
    kept: Promise,
    backend: Runner | None = None,
) -> list[str]:
    """What `cases` fail to cover of the promise, named; empty when the promise holds.

    Only combinations the topology (and the backend, if given) allows are required: a
    restricted value is never missing.
    """
    covering = model(allowed(topology_name, backend))
    rows = [c.row() for c in cases]
    lines = shortfall(covering, rows, kept.pairs_over, kept.each_value_of, kept.cells).lines()
    if kept.triples_over:
        lines += [format_interaction(t) for t in missing(covering, rows, 3, kept.triples_over)]
    return lines


def backend_cases(backend: Runner, topologies: Sequence[str] | None, name: str) -> list[Case]:
    """The selection's cases of the given topologies (default: all the backend runs).

    Naming a topology the backend does not run is an error that says why.
    """
    if topologies:
        for t in topologies:
            topology(t)
            backend.roles(t)
    chosen = topologies or [t for t in TOPOLOGIES if t in backend.topologies]
    return [case for t in chosen for case in selection(t, name, backend)]


def only(cases: list[Case], wanted: list[str] | None, backend: str, chosen: str) -> list[Case]:
    """The cases named by --handoff-case (all when none is named). A name that matches no
    case, or a selection left empty, is an error that says where to look."""
    if not cases:
        raise HandoffError(f"the {chosen} selection of {backend} is empty: no case to run")
    if not wanted:
        return cases
    for name in wanted:
        if not any(name in (c.key, c.id) for c in cases):
            raise HandoffError(
                f"unknown case {name!r} in the {chosen} selection of {backend}: "
                f"`handoff cases --backend {backend} --selection {chosen}` lists them"
            )
    return [c for c in cases if c.key in wanted or c.id in wanted]
