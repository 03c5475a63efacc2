"""Plugin modules that tests name as ``package.module:build`` user models."""
