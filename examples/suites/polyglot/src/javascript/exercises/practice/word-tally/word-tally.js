//
// This is only a SKELETON file for the 'Word Tally' exercise. It's been provided as a
// convenience to get you started writing code faster.
//

export const mostCommon = (text) => {
  throw new Error('Remove this statement and implement this function');
};
