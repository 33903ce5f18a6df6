from django.contrib import admin
from django.urls import include, path

from dashboard import accounts

urlpatterns = [
    path("admin/", admin.site.urls),
    path(
        "accounts/password_reset/", accounts.PasswordResetView.as_view(), name="password_reset"
    ),  # throttled
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("dashboard.urls")),
]
