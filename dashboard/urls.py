from django.urls import path

from dashboard import views

urlpatterns = [
    path("", views.fleet_page, name="fleet"),
    path("nodes/<str:name>/", views.node_page, name="node"),
]
