"""To and from an LMS: importing a submissions download, exporting a gradebook it imports."""
