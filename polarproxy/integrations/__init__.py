"""The small pieces that let an existing trainer train on polarproxy's exports where it has no way in of its
own (docs/trainers.md): each reads one `export --format` file and imports its trainer lazily, if at all."""
