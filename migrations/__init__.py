"""Alembic environment and revisions of the control plane's SQLite database (shipped with the
package; ``control.migrate`` builds the alembic configuration from this folder)."""
