from django.apps import AppConfig
from django.db.models.signals import post_migrate


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Fleet"

    def ready(self) -> None:
        from dashboard.roles import sync_roles

        post_migrate.connect(sync_roles, sender=self, dispatch_uid="dashboard.sync_roles")
