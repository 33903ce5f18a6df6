"""The Celery app; tasks live in the apps (dashboard/tasks.py)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "layercake.settings")

app = Celery("layercake")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
