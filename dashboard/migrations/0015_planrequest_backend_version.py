from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0014_merge_scale"),
    ]

    operations = [
        migrations.AddField(
            model_name="planrequest",
            name="backend_version",
            field=models.CharField(
                blank=True,
                help_text="the vLLM release that will serve (selects its non-torch memory)",
                max_length=40,
            ),
        ),
    ]
