import { mostCommon } from './word-tally';

describe('most common word', () => {
  test('empty text', () => {
    expect(mostCommon('')).toEqual('');
  });

  xtest('no letters', () => {
    expect(mostCommon('42 - 7!')).toEqual('');
  });

  xtest('case is ignored', () => {
    expect(mostCommon('Go go GO stop')).toEqual('go');
  });

  xtest('punctuation separates words', () => {
    expect(mostCommon('red,blue;red.')).toEqual('red');
  });

  xit('ties go to the first alphabetically', () => {
    expect(mostCommon('pear apple pear apple')).toEqual('apple');
  });
});
