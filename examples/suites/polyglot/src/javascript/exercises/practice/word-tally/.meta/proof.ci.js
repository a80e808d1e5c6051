export const mostCommon = (text) => {
  const counts = new Map();
  for (const word of text.toLowerCase().match(/[a-z]+/g) || []) {
    counts.set(word, (counts.get(word) || 0) + 1);
  }
  let best = '';
  let bestCount = 0;
  for (const [word, count] of counts) {
    if (count > bestCount || (count === bestCount && word < best)) {
      best = word;
      bestCount = count;
    }
  }
  return best;
};
