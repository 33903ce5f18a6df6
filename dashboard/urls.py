from django.urls import path

from dashboard import alert_views, api_pages, metrics_views, views
from dashboard.api import api

urlpatterns = [
    path("", views.fleet_page, name="fleet"),
    path("nodes/<str:name>/", views.node_page, name="node"),
    path("nodes/<str:name>/history.json", views.node_history, name="node-history"),
    path("deploy/", views.deploy_page, name="deploy"),
    path("deploy/plans/<int:pk>/", views.plan_page, name="plan"),
    path("deploy/plans/<int:pk>/fragment/", views.plan_fragment, name="plan-fragment"),
    path("deploy/plans/<int:pk>/<int:number>/deploy/", views.deploy_plan, name="deploy-plan"),
    path("deployments/", views.deployments_page, name="deployments"),
    path("deployments/<str:pk>/", views.deployment_page, name="deployment"),
    path("deployments/<str:pk>/<str:action>/", views.deployment_action, name="deployment-action"),
    path("calibration/", views.calibration_page, name="calibration"),
    path("demo/mails/", views.demo_mails, name="demo-mails"),
    path("alerts/", alert_views.alerts_page, name="alerts"),
    path("alerts/banner/", alert_views.alert_banner, name="alert-banner"),
    path("alerts/settings/", alert_views.alert_settings, name="alert-settings"),
    path("alerts/<int:pk>/", alert_views.alert_page, name="alert"),
    path("alerts/<int:pk>/acknowledge/", alert_views.alert_acknowledge, name="alert-acknowledge"),
    path("alerts/<int:pk>/replan/", alert_views.alert_replan, name="alert-replan"),
    path("metrics", metrics_views.metrics, name="metrics"),
    path("account/tokens/", api_pages.api_tokens_page, name="api-tokens"),
    path("api/v1/docs/", api_pages.api_docs, name="api-docs"),
    path("api/v1/", api.urls),
    path("api/v1/<path:rest>", api_pages.api_not_found),
]
