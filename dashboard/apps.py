from django.apps import AppConfig
from django.db.models.signals import post_migrate


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Fleet"

    def ready(self) -> None:
        # Imported here, not at the top: Django loads an app's models only once the app registry is ready.
        # dashboard.live connects the receivers that close a revoked token's agent sockets; dashboard.ingest
        # the ones that forget a node's inventory digest when a row of its inventory is deleted.
        from dashboard import ingest, live  # noqa: F401
        from dashboard.roles import sync_roles

        post_migrate.connect(sync_roles, sender=self, dispatch_uid="dashboard.sync_roles")
