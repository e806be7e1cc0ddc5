-- Which filter took a content item out of an objective, as data: for an
-- applied event whose item a filter now stops (where that moved counters),
-- {award: {objective: filter}}. Explain reads it; it used to be parsed
-- back from the reason text ("award/objective: excluded by filter NAME"),
-- which such rows now leave empty. Older rows keep their reason text.
ALTER TABLE processing_log ADD COLUMN excluded jsonb;
