"""Reading slides: one Slide type over openslide and tiffslide (DICOM series too), addressed in micrometres;
region plans, thumbnails, the file's own tiles and their colour, and where slides come from."""
