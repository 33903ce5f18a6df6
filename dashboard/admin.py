from django.contrib import admin, messages

from dashboard import roles
from dashboard.models import (
    AgentToken,
    Alert,
    AlertEvent,
    ApiToken,
    Channel,
    Deployment,
    DeploymentEvent,
    DeploymentMetric,
    Gpu,
    GpuSample,
    Link,
    LogChunk,
    Node,
    Notification,
    PlanRequest,
)


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "hostname", "simulated", "connected", "last_seen", "agent_version")
    search_fields = ("name", "hostname")
    inlines = [GpuInline]
    actions = ["issue_token"]

    @admin.action(description="Issue a new agent token (shown once)", permissions=["issue_token"])
    def issue_token(self, request, queryset):
        for node in queryset:
            _, plaintext = AgentToken.issue(node)
            self.message_user(
                request,
                f"Token for {node.name} (copy it now, it is not shown again): {plaintext}",
                messages.WARNING,
            )

    def has_issue_token_permission(self, request) -> bool:
        return request.user.has_perm(roles.ISSUE_TOKENS)


class TokenAdmin(admin.ModelAdmin):
    """Agent and API tokens alike: listed without the secret, revoked (not deleted) from the list."""

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke(self, request, queryset):
        for token in queryset.filter(revoked=None):
            token.revoke()


@admin.register(AgentToken)
class AgentTokenAdmin(TokenAdmin):
    list_display = ("prefix", "node", "created", "last_used", "revoked")
    list_filter = ("revoked",)
    readonly_fields = ("prefix", "created", "last_used")
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False  # tokens are issued from the node admin action or `manage.py agent_token`


@admin.register(ApiToken)
class ApiTokenAdmin(TokenAdmin):
    """Everyone's personal API tokens (never the secret): an admin can revoke a departed user's."""

    list_display = ("prefix", "user", "name", "scope", "created", "expires", "last_used", "revoked")
    list_filter = ("scope", "revoked")
    readonly_fields = ("user", "name", "scope", "prefix", "created", "expires", "last_used", "revoked")
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False  # each user makes their own, on the API tokens page or with `manage.py api_token`


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ("node", "index", "name", "memory_total_mib", "numa_node", "pci_bus_id")
    list_filter = ("node",)


@admin.register(Link)
class LinkAdmin(admin.ModelAdmin):
    list_display = ("node", "a", "b", "link", "p2p_read", "p2p_write")
    list_filter = ("node", "link")


@admin.register(GpuSample)
class GpuSampleAdmin(admin.ModelAdmin):
    list_display = ("gpu", "t", "seq", "util_gpu", "mem_used_mib", "temp_c", "power_w")
    list_filter = ("gpu__node",)
    date_hierarchy = "t"


@admin.register(LogChunk)
class LogChunkAdmin(admin.ModelAdmin):
    list_display = ("node", "source", "t", "seq")
    list_filter = ("node", "source")


@admin.register(PlanRequest)
class PlanRequestAdmin(admin.ModelAdmin):
    list_display = ("pk", "model_ref", "max_model_len", "concurrency", "status", "created", "created_by")
    list_filter = ("status",)


class DeploymentEventInline(admin.TabularInline):
    model = DeploymentEvent
    extra = 0
    readonly_fields = ("t", "state", "detail")


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ("pk", "name", "node", "state", "tokens_per_s", "created")
    list_filter = ("state", "node")
    inlines = [DeploymentEventInline]


@admin.register(DeploymentEvent)
class DeploymentEventAdmin(admin.ModelAdmin):
    list_display = ("deployment", "t", "state", "detail")
    list_filter = ("state",)


@admin.register(DeploymentMetric)
class DeploymentMetricAdmin(admin.ModelAdmin):
    list_display = ("deployment", "t", "generation_tokens_per_s", "requests_running", "requests_waiting")
    list_filter = ("deployment",)


class AlertEventInline(admin.TabularInline):
    model = AlertEvent
    extra = 0
    readonly_fields = ("t", "old_status", "new_status", "reason")


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = ("pk", "title", "kind", "severity", "status", "opened", "resolved")
    list_filter = ("status", "kind", "severity")
    search_fields = ("key", "title")
    inlines = [AlertEventInline]


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin):
    list_display = ("owner", "kind", "value", "enabled", "disabled_reason", "last_notify", "last_error")
    list_filter = ("kind", "enabled")


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ("created", "alert", "channel", "status", "attempt", "duration", "error")
    list_filter = ("status", "channel__kind")
