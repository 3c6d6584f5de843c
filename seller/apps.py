from django.apps import AppConfig


class SellerConfig(AppConfig):
    """The sellers' box office (docs/api.md, "Events, seat maps and prices"):
    events as data (seat maps, price categories, sales rules, blocks), the
    reads a seller needs (purchases, exports, the report) and the seller
    pages. The rows are the purchases app's (Event, PriceCategory, Seat); who
    may do what is the organizers app's."""

    name = "seller"
    verbose_name = "seller"
