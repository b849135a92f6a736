"""Which failed episodes are samples of the policy: one taxonomy for exports, the trajectory stream,
`train --follow` and `rollout`.

- `infra`: outside the agent's control. The harness never reached the model (no call answered, and a
  non-zero exit or no exit at all, even when a verifier ran afterwards: a wrong path, a missing binary, a
  crash at start), or the episode was interrupted (its proxy died: the backend, the store or polarproxy).
  Such an episode is not a sample of the policy: it leaves its GRPO group and is counted
  (`excluded_failed`).
- `agent`: everything the agent can cause once it ran: a crash after its first answered call, a time limit,
  a verifier timeout, a workspace that could not be graded. It keeps its reward, or gets 0.0 when it has
  none, and stays in its group.

`--failed-as-zero` keeps `infra` episodes in their groups too (with their reward, or 0.0): the rule before
2026-12-06, when every failed episode was counted as a sample.
"""

from __future__ import annotations

from typing import Literal

from polarproxy.store.records import Episode

FailureClass = Literal["infra", "agent"]


def failure_class(ep: Episode, answered_calls: int | None) -> FailureClass | None:
    """None for an episode that ran to its end (or still runs); else its class. `answered_calls`: how many
    of its calls the model answered (status ok); None when not known (then only `interrupted` is infra)."""
    if ep.status == "running":
        return None
    if ep.status == "interrupted":
        return "infra"
    if ep.status != "failed" and ep.exit_code in (0, None):
        return None
    if answered_calls == 0:
        return "infra"
    return "agent"
