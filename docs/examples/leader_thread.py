"""A service that runs on every replica, with one loop that runs on one replica only.

Run it on several hosts with CELERY_LEADER_URL set (redis://, postgresql://,
mysql://, etcd://, file://); stop one with SIGTERM and another takes the loop over at once.
"""

import signal
import threading

from celery_leader import Leadership, leader_loop
from celery_leader.backends import HolderInfo


@leader_loop("cleanup", interval=0.2)
def cleanup(epoch: int) -> None:
    # Runs only while this replica leads. Pass the epoch with what it writes,
    # so that a store that remembers the highest epoch can refuse an old leader.
    print(f"cleanup under epoch {epoch}", flush=True)


def announce(holder: HolderInfo) -> None:
    # Every replica hears of every new leader, followers included.
    print(f"leader is {holder.instance_id} (epoch {holder.epoch})", flush=True)


def main() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    with Leadership("cleanup", on_new_leader=announce):
        loop = threading.Thread(target=cleanup, args=(stop,))
        loop.start()
        # ... the rest of the service (an HTTP server, a consumer) runs here ...
        stop.wait()
        loop.join()  # leaves the election: another replica takes over at once


if __name__ == "__main__":
    main()
