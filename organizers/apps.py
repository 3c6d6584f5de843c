from django.apps import AppConfig


class OrganizersConfig(AppConfig):
    name = "organizers"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Organizers"
