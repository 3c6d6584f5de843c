"""The seller pages (docs/api.md, "Pages for sellers"): Django templates and
a little htmx on the same services and selectors as the seller's API, one
module per page family. Who may open a page is seller/page_access.py's to
say, and nothing here checks it again; the routes are seller/page_urls.py."""
