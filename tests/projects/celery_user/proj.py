# celery_user/proj.py
from celery import Celery
from celery_leader import current_epoch, ensure_leader, leader_only

app = Celery("proj")
app.conf.beat_schedule = {
    "refresh-prices": {"task": "proj.refresh_prices", "schedule": 60.0},
}


@app.task
@leader_only  # on_follower="wait": sent to the leader queue, run by the leader only
def refresh_prices() -> str:
    return f"refreshed under epoch {current_epoch()}"


@app.task
@leader_only(election="reports", on_follower="skip")
def send_digest() -> str:
    ensure_leader("reports")  # between steps of a long body
    return "sent"
