"""The HTTP routes, one APIRouter per concern; `app.create_app` includes them."""
