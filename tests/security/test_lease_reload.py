"""A config reload while Redis stalls keeps the replaced limiter's pending lease cancellations.

As in test_lease_redis_stall: a real `redis-server` frozen with SIGSTOP while requests holding
`concurrent` leases go through the gateway (uvicorn in a thread, real sockets). Their acquires went
unanswered, so each lease is to be cancelled by id once Redis answers again. Here the config file is
edited during the stall: the reload retires the old pipeline, whose limiter closes. Its pending cancels
must go to the new limiter (or Redis, on resuming, writes the late acquires and the leases hold their
slots for the lease TTL, ten minutes).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.helpers.faults import FaultServer, slow
from tests.helpers.redis import RedisServer
from tests.helpers.servers import rewrite, serve_config
from tests.helpers.waiting import wait_until

from .test_lease_redis_stall import config, full_burst, live_leases, post, redis_answers, stalled, warm


def test_a_reload_during_a_stall_hands_the_pending_cancels_to_the_new_limiter(
    redis: RedisServer, faults: FaultServer, tmp_path: Path
) -> None:
    limit = 3
    faults["short"].script(then=slow(0.2))  # admitted on local state, ends during the stall
    cfg = config(redis, faults, "fail_open", limit, ("warm", "short", "burst"))
    with serve_config(tmp_path, cfg, poll_every=0.1) as gw, ThreadPoolExecutor(8) as pool:
        assert redis_answers(gw)
        warm(gw, faults, redis)
        path = Path(gw.pipeline.loaded.source)
        with stalled(redis):
            served = [pool.submit(post, gw, "short") for _ in range(limit)]
            assert [f.result() for f in served] == [200] * limit, "fail_open serves during the stall"
            old = gw.pipeline
            wait_until(lambda: old.admission.limiter._cancels, timeout=10)  # noqa: SLF001
            rewrite(path, cfg + "# edited during the stall\n")
            wait_until(lambda: gw.pipeline is not old, timeout=10)
            # The old pipeline has closed (nothing was in flight on it): its limiter is gone.
            wait_until(lambda: old._closing is not None and old._closing.done(), timeout=10)  # noqa: SLF001
        # Within a short bound after Redis answers again, it holds no lease: the cancels were delivered.
        wait_until(lambda: live_leases(redis) == 0, timeout=8, interval=0.05)
        wait_until(lambda: redis_answers(gw), timeout=5, interval=0.1)
        full_burst(gw, faults, pool, limit)
